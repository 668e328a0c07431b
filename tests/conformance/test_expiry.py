"""The idle rule on every backend: a session residency with no store of its session on its
worker for `session_idle` is dropped, whatever it holds; its blocks stay on the worker.

A hot system prompt is shared by every session and never evicted: before the rule covered
residencies holding blocks, a session whose residency was only that prompt never expired.
"""

from __future__ import annotations

from prometheus_client import REGISTRY

from kvsi.janitor import sweep
from kvsi.store.base import IndexStore
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    Expired,
    WorkerKey,
    WorkerLosses,
)
from tests.conformance.checks import apply_twice

A = WorkerKey("pod-a", 0)
B = WorkerKey("pod-b", 0)
PROMPT = [101, 102, 103]
"""A system prompt every session starts with, never evicted."""
IDLE = 3600.0


def turn(sid: str, *own: int) -> EntriesStored:
    return EntriesStored([*PROMPT, *own], "GPU", 0, sid)


async def blocks_of(store: IndexStore, pod: str) -> list[int]:
    page = await store.worker_blocks(pod, dp_rank=None, medium=None, limit=100, cursor=None)
    assert page is not None
    return sorted(int(h) for h in page.items)


async def listed(store: IndexStore) -> list[str]:
    page = await store.list_sessions(pod=None, limit=100, cursor=None)
    return [s.session_id for s in page.items]


async def test_a_session_holding_only_the_shared_prompt_expires_and_the_prompt_stays(
    store: IndexStore,
) -> None:
    await apply_twice(store, A, Batch(0, 10.0, [turn("old", 1)]))
    await apply_twice(store, A, Batch(1, 20.0, [EntriesRemoved([1])]))  # its own block evicted
    await apply_twice(store, A, Batch(2, 4000.0, [turn("recent", 2)]))
    old = await store.get_session("old")
    assert old is not None and old.total_blocks == 3  # only the prompt, kept by "recent"
    swept = await sweep(store, now=3700.0, session_idle=IDLE, worker_grace=600.0)
    assert swept.expired.sessions == 1
    assert await store.get_session("old") is None
    assert await listed(store) == ["recent"]
    assert await store.session_blocks("old", pod=None, medium=None, limit=10, cursor=None) is None
    # The worker still holds the prompt (and "recent" its blocks): routing is unaffected.
    assert await blocks_of(store, "pod-a") == [2, *PROMPT]
    assert await store.match_prefix(PROMPT, [A]) == {A: [("GPU",)] * 3}
    recent = await store.get_session("recent")
    assert recent is not None and recent.total_blocks == 4
    (worker,) = await store.list_workers()
    assert (worker.blocks, worker.sessions) == (4, 1)


async def test_the_prompts_last_holder_leaves_it_to_the_worker(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 10.0, [turn("s1", 1), turn("s2", 2)]))
    swept = await sweep(store, now=5000.0, session_idle=IDLE, worker_grace=600.0)
    assert swept.expired == Expired(residencies=2, sessions=2, more=False)
    assert await listed(store) == []
    assert await blocks_of(store, "pod-a") == [1, 2, *PROMPT]
    (worker,) = await store.list_workers()
    assert (worker.blocks, worker.sessions) == (5, 0)
    # The blocks held by no session are still evicted normally, and stored again.
    await apply_twice(store, A, Batch(1, 5001.0, [EntriesRemoved([1, 101])]))
    assert await blocks_of(store, "pod-a") == [2, 102, 103]
    await apply_twice(store, A, Batch(2, 5002.0, [turn("s3")]))
    s3 = await store.get_session("s3")
    assert s3 is not None and s3.total_blocks == 3


async def test_a_recent_store_keeps_the_residency_and_the_sharers_are_unaffected(
    store: IndexStore,
) -> None:
    await apply_twice(store, A, Batch(0, 10.0, [turn("idle", 1), turn("busy", 2)]))
    await apply_twice(store, A, Batch(1, 3000.0, [turn("busy", 3)]))
    await sweep(store, now=3700.0, session_idle=IDLE, worker_grace=600.0)
    assert await store.get_session("idle") is None
    busy = await store.get_session("busy")
    assert busy is not None and busy.total_blocks == 5 and busy.last_seen == 3000.0
    page = await store.session_blocks("busy", pod=None, medium=None, limit=10, cursor=None)
    assert page is not None and sorted(int(h) for h in page.items) == [2, 3, *PROMPT]
    # Evicting the prompt now takes it from "busy" only, as a loss.
    await apply_twice(store, A, Batch(2, 3001.0, [EntriesRemoved(PROMPT)]))
    busy = await store.get_session("busy")
    assert busy is not None and busy.total_blocks == 2
    assert busy.workers[0].lost_blocks == 3


async def test_residencies_expire_per_worker(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 10.0, [turn("s", 1)]))
    await apply_twice(store, B, Batch(0, 3000.0, [turn("s", 1)]))
    swept = await sweep(store, now=3700.0, session_idle=IDLE, worker_grace=600.0)
    assert swept.expired == Expired(residencies=1, sessions=0, more=False)
    view = await store.get_session("s")
    assert view is not None and [w.pod for w in view.workers] == ["pod-b"]
    assert view.last_seen == 3000.0
    assert await blocks_of(store, "pod-a") == [1, *PROMPT]


async def test_a_later_store_brings_the_session_back_with_fresh_bookkeeping(
    store: IndexStore,
) -> None:
    await apply_twice(store, A, Batch(0, 10.0, [turn("s", 1, 2)]))
    await apply_twice(store, A, Batch(1, 11.0, [EntriesRemoved([2])]))
    assert (await store.worker_losses())[A] == WorkerLosses(sessions_hurt=1, lost_blocks=1)
    await sweep(store, now=3700.0, session_idle=IDLE, worker_grace=600.0)
    assert (await store.worker_losses())[A] == WorkerLosses()  # its loss went with it
    await apply_twice(store, A, Batch(2, 3800.0, [EntriesStored([103, 1], "GPU", 0, "s", 102)]))
    view = await store.get_session("s")
    assert view is not None and view.last_seen == 3800.0
    (res,) = view.workers
    assert (res.blocks, res.lost_blocks, res.last_seen) == (2, 0, 3800.0)
    assert res.frontier is not None and res.frontier.position is None  # not 3: started afresh
    page = await store.session_blocks("s", pod=None, medium=None, limit=10, cursor=None)
    assert page is not None and sorted(int(h) for h in page.items) == [1, 103]


async def test_a_pass_drops_at_most_its_limit_per_worker_oldest_first(
    store: IndexStore,
) -> None:
    for i in range(5):
        await apply_twice(store, A, Batch(i, 10.0 + i, [turn(f"s{i}", i)]))
    await apply_twice(store, A, Batch(5, 15.0, [turn("s0", 50)]))  # s0 is now the newest
    first = await store.expire_sessions(older_than=100.0, limit=2)
    assert first == Expired(residencies=2, sessions=2, more=True)
    assert sorted(await listed(store)) == ["s0", "s3", "s4"]
    second = await store.expire_sessions(older_than=100.0, limit=2)
    assert second == Expired(residencies=2, sessions=2, more=True)
    assert await listed(store) == ["s0"]
    last = await store.expire_sessions(older_than=100.0, limit=2)
    assert last == Expired(residencies=1, sessions=1, more=False)
    assert await store.expire_sessions(older_than=100.0, limit=2) == Expired(0, 0, False)
    assert await blocks_of(store, "pod-a") == [0, 1, 2, 3, 4, 50, *PROMPT]


async def test_a_removed_workers_sessions_outlive_it_until_idle(store: IndexStore) -> None:
    await apply_twice(store, B, Batch(0, 3000.0, [turn("s", 1)]))
    await apply_twice(store, A, Batch(0, 10.0, [turn("s", 1)]))
    await store.remove_worker(B)
    swept = await sweep(store, now=3700.0, session_idle=IDLE, worker_grace=600.0)
    assert swept.expired == Expired(residencies=1, sessions=0, more=False)
    view = await store.get_session("s")
    assert view is not None and view.total_blocks == 0 and view.last_seen == 3000.0
    swept = await sweep(store, now=7000.0, session_idle=IDLE, worker_grace=600.0)
    # What a removed worker left is a record of the session, not a residency.
    assert swept.expired == Expired(residencies=0, sessions=1, more=False)
    assert await store.get_session("s") is None


def counted(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_the_janitor_counts_what_expired(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 10.0, [turn("s1", 1), turn("s2", 2)]))
    await apply_twice(store, B, Batch(0, 10.0, [turn("s1", 1)]))
    sessions = counted("kvsi_sessions_expired_total")
    residencies = counted("kvsi_session_residencies_expired_total")
    await sweep(store, now=3700.0, session_idle=IDLE, worker_grace=600.0)
    assert counted("kvsi_sessions_expired_total") - sessions == 2
    assert counted("kvsi_session_residencies_expired_total") - residencies == 3
