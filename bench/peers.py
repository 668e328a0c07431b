"""Dynamo (ai-dynamo-runtime, the `peers` extra) as the peer the ingest benches measure against.

Imports dynamo only in `dynamo_llm()`: without the extra every bench runs kvsi alone and says
so in one line. Nothing here is Dynamo's code; it drives its published Python API.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

import msgspec

from kvsi.subscriber import wire

PEER_PACKAGE = "ai-dynamo-runtime"
WORKER_ID = 1
"""The one worker the in-process tree indexes (dp_rank 0), as kvsi's bench uses pod-a/0."""

LocalHashes = Callable[[list[int], int], list[int]]
"""`dynamo.llm.compute_block_hash_for_seq(tokens, block_size)`: one hash per full block."""


def dynamo_llm() -> ModuleType | None:
    """`dynamo.llm`, or None when ai-dynamo-runtime is not installed in this interpreter."""
    try:
        import dynamo.llm
    except ImportError:
        return None
    return dynamo.llm


def peer_version() -> str:
    return f"{PEER_PACKAGE} {metadata.version(PEER_PACKAGE)}"


def missing_line(what: str) -> str:
    return (
        f"{what}: not measured, {PEER_PACKAGE} is not importable here "
        "(a venv with `pip install -e '.[peers]'`, see bench/README.md)"
    )


@dataclass(slots=True)
class RadixEvents:
    """A workload as `RadixTree.apply_event` takes it: one JSON `KvCacheEvent` per event."""

    events: list[bytes] = field(default_factory=list)
    rerooted: int = 0
    """Stores whose parent the worker did not hold: sent with no parent (from the root)."""
    removes_dropped: int = 0
    """Removed block hashes the worker did not hold: left out (the tree rejects them)."""


def radix_events(payloads: Sequence[bytes], local_hashes: LocalHashes) -> RadixEvents:
    """Translate vLLM 0.33 payloads into the tree's events, once, before any timing.

    A store keeps its block hashes (Dynamo's `block_hash`) and gets each block's tokens hash
    from its token ids, as Dynamo's own ZMQ listener computes it. The tree refuses a store
    whose parent it does not hold and a remove of a block it does not hold (it raises and
    indexes nothing), so the worker's resident blocks are followed here: such a store starts
    at the root, such hashes are left out; both are counted.
    """
    decoder = msgspec.msgpack.Decoder(wire.KVEventBatch)
    out = RadixEvents()
    resident: set[int] = set()
    for payload in payloads:
        for event in decoder.decode(payload).events:
            data = _event_data(event, resident, local_hashes, out)
            if data is not None:
                body = {"event_id": len(out.events), "data": data, "dp_rank": 0}
                out.events.append(json.dumps(body, separators=(",", ":")).encode())
    return out


def _event_data(
    event: wire.KVCacheEvent, resident: set[int], local_hashes: LocalHashes, out: RadixEvents
) -> Any:
    if isinstance(event, wire.BlockStored):
        return _stored(event, resident, local_hashes, out)
    if isinstance(event, wire.BlockRemoved):
        held = [h for h in _ints(event.block_hashes) if h in resident]
        out.removes_dropped += len(event.block_hashes) - len(held)
        resident.difference_update(held)
        return {"removed": {"block_hashes": held}} if held else None
    resident.clear()
    return "cleared"


def _stored(
    event: wire.BlockStored, resident: set[int], local_hashes: LocalHashes, out: RadixEvents
) -> dict[str, Any]:
    hashes = _ints(event.block_hashes)
    tokens = local_hashes(list(event.token_ids), event.block_size)
    if len(tokens) != len(hashes):
        raise ValueError(
            f"a store of {len(hashes)} blocks has {len(event.token_ids)} token ids "
            f"({len(tokens)} full blocks of {event.block_size})"
        )
    parent = event.parent_block_hash
    if parent is not None and parent not in resident:
        out.rerooted += 1
        parent = None
    resident.update(hashes)
    blocks = [{"block_hash": h, "tokens_hash": t} for h, t in zip(hashes, tokens, strict=True)]
    return {"stored": {"parent_hash": parent, "blocks": blocks}}


def _ints(hashes: Sequence[int | bytes]) -> list[int]:
    if not all(isinstance(h, int) for h in hashes):
        raise ValueError("the peer bench needs integer block hashes (vLLM's 64-bit form)")
    return [h for h in hashes if isinstance(h, int)]


@dataclass(slots=True)
class TreeRun:
    seconds: float
    errors: int


def time_radix_tree(llm: ModuleType, events: Sequence[bytes]) -> TreeRun:
    """`RadixTree.apply_event` for every event into a fresh tree (its thread starts with it).

    Each call parses the event's JSON and returns once the tree's thread has applied it (a
    rejected event raises in the caller), so the loop's time is parse plus apply, all events.
    """
    tree = llm.RadixTree()
    apply = tree.apply_event
    errors = 0
    started = time.perf_counter()
    for event in events:
        try:
            apply(WORKER_ID, event)
        except RuntimeError:
            errors += 1
    return TreeRun(time.perf_counter() - started, errors)
