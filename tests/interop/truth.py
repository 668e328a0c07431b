"""Compare what the REST API says with the vLLM workers: their block pools and their events.

Each worker's blocks are read from its block pool, never from the events. Session residency
is what the worker's published events say (DESIGN.md's definition), checked to lie within the
pool. Reads the API over HTTP only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx
import pytest

pytest.importorskip("vllm.distributed.kv_events", reason="vLLM is not installed (make interop)")

from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

from tests.e2e.truth import listing
from tests.faults.harness import sessions_with_blocks
from tests.interop.engines import VllmWorker
from tests.interop.fleet import WorkerKey

Hash = int | bytes


def session_residency(events: Iterable[KVCacheEvent]) -> dict[str, set[Hash]]:
    """Per session, the blocks one worker's events give it: listed by a BlockStored with its
    session_id, minus those a BlockRemoved removed since; AllBlocksCleared empties all."""
    sessions: dict[str, set[Hash]] = {}
    for event in events:
        if isinstance(event, BlockStored) and event.session_id is not None:
            sessions.setdefault(event.session_id, set()).update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            for blocks in sessions.values():
                blocks.difference_update(event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            sessions.clear()
    return {session: blocks for session, blocks in sessions.items() if blocks}


async def workers_view(client: httpx.AsyncClient) -> dict[WorkerKey, dict[str, Any]]:
    """`GET /v1/pods` keyed by (pod, DP rank)."""
    response = await client.get("/v1/pods")
    response.raise_for_status()
    return {(p["pod"], p["dp_rank"]): p for p in response.json()["pods"]}


async def caught_up(client: httpx.AsyncClient, workers: dict[WorkerKey, VllmWorker]) -> bool:
    """Every worker is live and its last applied seq is the last its publisher sent."""
    found = await workers_view(client)
    return all(
        key in found and found[key]["state"] == "live" and found[key]["last_seq"] == w.batches - 1
        for key, w in workers.items()
    )


async def mismatches(client: httpx.AsyncClient, workers: dict[WorkerKey, VllmWorker]) -> list[str]:
    """Where the API disagrees with the workers; [] when the index equals them.

    Per worker: its blocks against the block pool. Per session: the sessions with blocks, the
    block count per worker, and the blocks per pod, against the events.
    """
    problems: list[str] = []
    truth: dict[str, dict[WorkerKey, set[Hash]]] = {}
    for key, worker in workers.items():
        pool = worker.resident()
        got = await listing(client, f"/v1/pods/{key[0]}/blocks", dp_rank=str(key[1]))
        if got != pool:
            problems.append(f"{key}: {len(got - pool)} extra, {len(pool - got)} missing")
        for session, blocks in session_residency(worker.published).items():
            if not blocks <= pool:
                problems.append(f"{session}@{key}: events name {len(blocks - pool)} evicted")
            truth.setdefault(session, {})[key] = blocks
    indexed = await sessions_with_blocks(client)
    if indexed != set(truth):
        problems.append(f"sessions: {sorted(indexed ^ set(truth))} differ")
    for session, by_worker in sorted(truth.items()):
        problems.extend(await _session_mismatches(client, session, by_worker))
    return problems


async def _session_mismatches(
    client: httpx.AsyncClient, session: str, by_worker: dict[WorkerKey, set[Hash]]
) -> list[str]:
    response = await client.get(f"/v1/sessions/{session}")
    if response.status_code == 404:
        return [f"{session}: unknown to the API"]
    response.raise_for_status()
    problems: list[str] = []
    counts = {(p["pod"], p["dp_rank"]): p["blocks"] for p in response.json()["pods"] if p["blocks"]}
    want = {key: len(blocks) for key, blocks in by_worker.items()}
    if counts != want:
        problems.append(f"{session}: counts {counts} != {want}")
    for pod in sorted({pod for pod, _ in by_worker}):
        union = set().union(*(b for (name, _), b in by_worker.items() if name == pod))
        got = await listing(client, f"/v1/sessions/{session}/blocks", pod=pod)
        if got != union:
            problems.append(
                f"{session}@{pod}: {len(got - union)} extra, {len(union - got)} missing"
            )
    return problems
