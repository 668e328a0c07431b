"""The janitor keeps memory flat on every backend: idle sessions and gone workers go."""

from __future__ import annotations

import pytest

from kvsi.janitor import sweep
from kvsi.store.base import IndexStore
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    WorkerKey,
    WorkerState,
    WorkerStatus,
    WorkerView,
)
from tests.waiting import eventually

LIVE = WorkerKey("pod-live", 0)
GONE = WorkerKey("pod-gone", 0)
RECENT = WorkerKey("pod-recent", 0)


async def test_disconnected_past_grace_is_removed_others_stay(store: IndexStore) -> None:
    for worker in (LIVE, GONE, RECENT):
        await store.apply(worker, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s")]))
    await store.set_status(LIVE, WorkerStatus(WorkerState.LIVE, 100.0))
    await store.set_status(GONE, WorkerStatus(WorkerState.DISCONNECTED, 100.0))
    await store.set_status(RECENT, WorkerStatus(WorkerState.DISCONNECTED, 950.0))
    swept = await sweep(store, now=1000.0, session_idle=1e9, worker_grace=600.0)
    assert swept.workers == [GONE]
    assert sorted(w.pod for w in await store.list_workers()) == ["pod-live", "pod-recent"]
    assert (
        await store.worker_blocks("pod-gone", dp_rank=None, medium=None, limit=5, cursor=None)
        is None
    )
    view = await store.get_session("s")
    assert view is not None
    assert sorted(p.pod for p in view.workers) == ["pod-live", "pod-recent"]


async def test_an_ingest_only_pass_leaves_gone_workers_to_the_whole_index_sweep(
    store: IndexStore,
) -> None:
    await store.apply(GONE, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))
    await store.set_status(GONE, WorkerStatus(WorkerState.DISCONNECTED, 100.0))
    swept = await sweep(store, now=1000.0, session_idle=1e9, worker_grace=600.0, written_only=True)
    assert swept.workers == []
    assert [w.pod for w in await store.list_workers()] == ["pod-gone"]
    swept = await sweep(store, now=1000.0, session_idle=1e9, worker_grace=600.0)
    assert swept.workers == [GONE]


async def test_idle_sessions_without_blocks_are_forgotten(store: IndexStore) -> None:
    await store.apply(LIVE, Batch(0, 10.0, [EntriesStored([1], "GPU", 0, "idle")]))
    await store.apply(LIVE, Batch(1, 20.0, [EntriesStored([2], "GPU", 0, "busy")]))
    await store.apply(LIVE, Batch(2, 30.0, [EntriesRemoved([1])]))
    swept = await sweep(store, now=3615.0, session_idle=3600.0, worker_grace=600.0)
    assert swept.expired.sessions == 1 and swept.workers == []
    assert await store.get_session("idle") is None
    assert await store.get_session("busy") is not None


async def test_a_pass_lists_the_workers_only_when_one_reads_disconnected(
    store: IndexStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing reads every worker's meta on a shared store: a fleet with no disconnected
    worker is not listed at all (the states a route reads tell, as old as a shared store's
    registry cache)."""
    for worker in (LIVE, GONE):
        await store.apply(worker, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))
        await store.set_status(worker, WorkerStatus(WorkerState.LIVE, 100.0))
    listed: list[None] = []
    list_workers = type(store).list_workers

    async def counted(self: IndexStore) -> list[WorkerView]:
        listed.append(None)
        return await list_workers(self)

    monkeypatch.setattr(type(store), "list_workers", counted)
    swept = await sweep(store, now=1000.0, session_idle=1e9, worker_grace=600.0)
    assert swept.workers == [] and listed == []
    await store.set_status(GONE, WorkerStatus(WorkerState.DISCONNECTED, 100.0))

    async def disconnected() -> bool:
        return (await store.worker_states()).get(GONE) is WorkerState.DISCONNECTED

    await eventually(disconnected)
    swept = await sweep(store, now=1000.0, session_idle=1e9, worker_grace=600.0)
    assert swept.workers == [GONE] and len(listed) == 1
