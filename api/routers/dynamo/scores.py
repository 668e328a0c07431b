"""Dynamo's overlap answer from the index: matched tokens per instance, rank and tier.

Imports the store model only; free of HTTP. Dynamo's standalone indexer walks its radix tree
from the prompt's first block: a worker's device-tier score is the run of leading blocks it
holds on the device; the host tier extends that run with the blocks after it held on the
host, and the disk tier extends the host's (so gpu <= cpu <= disk). `store.match_prefix`
gives the same walk: the media holding each block of the run the worker holds anywhere.

Media to tiers: GPU is the device; CPU the host; every other medium (DISK, STORAGE, a
connector's) the disk tier. Counts are in tokens: blocks x the (model, group)'s block size.
`frequencies` (how often each matched block was looked up before) is not kept: always empty,
as Dynamo's own default (concurrent) indexer leaves it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvsi.store.model import WorkerKey
from kvsi.store.registry import DynamoInstance

DEVICE_MEDIA = frozenset({"GPU", "DEVICE"})
HOST_MEDIA = frozenset({"CPU", "CPU_PINNED", "CPU_TIER1"})


@dataclass(frozen=True)
class Reach:
    """How far a worker holds the prompt, in blocks, each tier cumulative over the last."""

    gpu: int
    cpu: int
    disk: int


def _run(held: Sequence[tuple[str, ...]], start: int, media: frozenset[str] | None) -> int:
    """Blocks from `start` held on one of `media` (None: on a medium of neither set)."""
    end = start
    while end < len(held) and any(_in_tier(m, media) for m in held[end]):
        end += 1
    return end


def _in_tier(medium: str, media: frozenset[str] | None) -> bool:
    if media is None:
        return medium not in DEVICE_MEDIA and medium not in HOST_MEDIA
    return medium in media


def reach(held: Sequence[tuple[str, ...]]) -> Reach:
    """The tiers' cumulative runs over `held`: the media of each block of the worker's run."""
    gpu = _run(held, 0, DEVICE_MEDIA)
    cpu = _run(held, gpu, HOST_MEDIA)
    return Reach(gpu, cpu, _run(held, cpu, None))


def overlap_answer(
    instances: Iterable[DynamoInstance],
    held: Mapping[WorkerKey, Sequence[tuple[str, ...]]],
    block_size: int,
) -> dict[str, Any]:
    """The body of `/query` and `/query_by_hash` for these registrations (one model and
    group), ordered by instance id then rank. Only what matched is listed, as Dynamo lists
    it: `scores` the ranks matching on the device tier, `instances` the instances matching
    on any tier, their `dp` each rank matching on any tier (0 if not on the device).
    `frequencies` stays empty (see the module doc)."""
    scores: dict[str, dict[str, int]] = {}
    per_instance: dict[str, dict[str, Any]] = {}
    for instance in instances:
        r = reach(held.get(instance.worker, ()))
        if not r.disk:
            continue
        iid, rank = str(instance.instance_id), str(instance.dp_rank)
        line = per_instance.setdefault(iid, {"gpu": 0, "dp": {}, "cpu": 0, "disk": 0})
        if r.gpu:
            scores.setdefault(iid, {})[rank] = r.gpu * block_size
        line["dp"][rank] = r.gpu * block_size
        line["gpu"] = max(line["gpu"], r.gpu * block_size)
        line["cpu"] = max(line["cpu"], r.cpu * block_size)
        line["disk"] = max(line["disk"], r.disk * block_size)
    return {
        "scores": scores,
        "frequencies": [],
        "instances": {
            iid: {"longest_matched": line["disk"], **line} for iid, line in per_instance.items()
        },
    }
