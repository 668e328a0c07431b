"""The change feed, on every backend: the memory store's records are the reference.

A subscriber of `await store.change_feed()` must get, per worker and in that worker's order,
exactly the changes the memory store publishes for the same writes: one row per session
whose blocks a batch changed (added, removed, total now) and one record per worker state
change. The Redis store's hub is fed asynchronously from its streams, so the test waits,
within a deadline, for as many changes as the reference produced.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Literal

import pytest

from kvsi.store.base import IndexStore
from kvsi.store.feed import Change, FeedEntry, HistoryGone, ResidencyChange, Subscription
from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    StoreEvent,
    WorkerCleared,
    WorkerKey,
    WorkerState,
    WorkerStatus,
)

A = WorkerKey("pod-a.ns.svc", 0)  # dots in a pod name: ids must still split at the last one
B = WorkerKey("pod-b", 1)
DIGEST = bytes(range(32))
DEADLINE = 10.0

WorkerOp = Literal["mark", "drop", "clear", "expire"]
"""mark_unconfirmed, drop_unconfirmed (the stale policy), clear_worker and an expiry pass
(every worker, residencies last stored before EXPIRE_BEFORE): no batch."""
EXPIRE_BEFORE = 100.0
Op = tuple[WorkerKey, Batch | WorkerStatus | WorkerOp]


def drain(sub: Subscription) -> list[FeedEntry]:
    out = []
    while not sub.queue.empty():
        entry = sub.queue.get_nowait()
        assert entry is not None, "overflowed"
        out.append(entry)
    return out


async def receive(sub: Subscription, count: int) -> list[FeedEntry]:
    """`count` entries, waiting at most DEADLINE; then a short pause must bring no more."""
    got: list[FeedEntry] = []
    deadline = time.monotonic() + DEADLINE
    while len(got) < count and time.monotonic() < deadline:
        got += drain(sub)
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    got += drain(sub)
    return got


def per_worker(entries: list[FeedEntry]) -> dict[tuple[str, int], list[Change]]:
    out: dict[tuple[str, int], list[Change]] = {}
    for e in entries:
        out.setdefault((e.change.pod, e.change.dp_rank), []).append(e.change)
    return out


async def run(store: IndexStore, ops: list[Op]) -> None:
    for worker, op in ops:
        if isinstance(op, Batch):
            await store.apply(worker, op)
        elif isinstance(op, WorkerStatus):
            await store.set_status(worker, op)
        elif op == "mark":
            await store.mark_unconfirmed(worker)
        elif op == "drop":
            await store.drop_unconfirmed(worker)
        elif op == "expire":
            await store.expire_sessions(EXPIRE_BEFORE, 1000)
        else:
            await store.clear_worker(worker)


async def check_against_memory(store: IndexStore, ops: list[Op]) -> list[FeedEntry]:
    """Run `ops` on `store` and on a memory store; the feeds must agree. Returns the entries."""
    reference = MemoryStore()
    ref_sub = (await reference.change_feed()).subscribe(after=None)
    sub = (await store.change_feed()).subscribe(after=None)
    await run(reference, ops)
    await run(store, ops)
    expected = drain(ref_sub)
    got = await receive(sub, len(expected))
    assert per_worker(got) == per_worker(expected)
    return got


def scripted() -> list[Op]:
    """Every kind of change: shared blocks, orphans adopted, reuse only, duplicates, a
    previous engine, a restart and a clear followed by stores in the same batch, two parts,
    digests, and worker states (repeated ones publish nothing)."""
    return [
        (A, WorkerStatus(WorkerState.CONNECTING, 1.0)),  # the initial state: no change
        (A, WorkerStatus(WorkerState.LIVE, 2.0)),
        (A, Batch(0, 10.0, [EntriesStored([1, 2, 3], "GPU", 0, "s1"), EntriesStored([9])])),
        (B, Batch(5, 10.0, [EntriesStored([1, 2], "GPU", 0, "s1")])),
        (A, Batch(1, 11.0, [EntriesStored([3, 4], "GPU", 0, "s2"),
                            EntriesStored([9], None, 0, "s3")])),  # s3 adopts the orphan
        (A, Batch(2, 12.0, [EntriesStored([1, 2], "GPU", 0, "s1")])),  # reuse only: no record
        (A, Batch(2, 12.0, [EntriesStored([7], "GPU", 0, "s1")])),  # duplicate: nothing
        (A, Batch(3, 13.0, [EntriesRemoved([3, 1]), EntriesStored([3], "CPU", 0, "s1")])),
        (A, WorkerStatus(WorkerState.LIVE, 3.0)),  # same state and detail: nothing
        (A, WorkerStatus(WorkerState.DEGRADED, 4.0, "gap")),
        (A, WorkerStatus(WorkerState.DEGRADED, 5.0, "gap, twice")),
        (B, Batch(6, 11.0, [EntriesStored([DIGEST, 5], "CPU", 1, "s{x}"), EntriesRemoved([2])])),
        (A, Batch(4, 14.0, [EntriesStored([5], "GPU", 0, "s2"), WorkerCleared(),
                            EntriesStored([5, 6], "GPU", 0, "s2"), EntriesRemoved([6])])),
        (A, Batch(0, 9.0, [EntriesStored([8], "GPU", 0, "s9")])),  # previous engine: nothing
        (B, Batch(0, 20.0, [EntriesStored([2, 3], "GPU", 0, "s1"), EntriesStored([4])])),  # restart
        (B, Batch(1, 21.0, [EntriesRemoved([2, 4, 99]), EntriesStored([2], "GPU", 0, "s4")])),
        (B, WorkerStatus(WorkerState.DISCONNECTED, 6.0, "eof")),
        (B, Batch(2, 22.0, [EntriesStored([5, 6], "GPU", 0, "s4"), EntriesStored([7])])),
        (B, "mark"),
        (B, Batch(3, 23.0, [EntriesStored([5], "GPU", 0, "s4")])),  # reconfirms 5 only
        (B, "drop"),  # s4 loses 2 and 6; the orphans 4.. and 7 go without a row
        (A, Batch(5, 15.0, [EntriesStored([1, 2], "GPU", 0, "s1"), EntriesStored([1], "CPU")])),
        (A, "clear"),  # every residency with blocks ends at 0
        (A, "clear"),  # nothing left: no record
    ]  # fmt: skip


def randomized(seed: int, batches: int = 60) -> list[Op]:
    """Random batches on two workers over few hashes and sessions: many shared blocks."""
    rng = random.Random(seed)
    ops: list[Op] = []
    seqs = {A: 0, B: 0}
    ts = {A: 100.0, B: 100.0}
    for _ in range(batches):
        w = rng.choice((A, B))
        events: list[StoreEvent] = []
        for _ in range(rng.randint(1, 4)):
            roll = rng.random()
            hashes = rng.sample(range(1, 40), rng.randint(1, 6))
            if roll < 0.55:
                sid = rng.choice(["s1", "s2", "s3", "s4", None])
                medium = rng.choice(["GPU", "GPU", "CPU"])
                events.append(EntriesStored(hashes, medium, 0, sid))
            elif roll < 0.93:
                events.append(EntriesRemoved(hashes, rng.choice([None, "CPU"])))
            else:
                events.append(WorkerCleared())
        if rng.random() < 0.05:  # an engine restart
            seqs[w] = 0
            ts[w] += 50
        ops.append((w, Batch(seqs[w], ts[w], events)))
        seqs[w] += 1
        ts[w] += 1
        roll = rng.random()
        if roll < 0.08:
            ops.append((w, rng.choice(["mark", "mark", "drop", "clear"])))
        if rng.random() < 0.1:
            state = rng.choice(list(WorkerState))
            ops.append((w, WorkerStatus(state, ts[w], rng.choice(["", "x"]))))
    return ops


async def test_the_feed_has_the_memory_stores_changes(store: IndexStore) -> None:
    got = await check_against_memory(store, scripted())
    assert len(got) >= 20


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_writes_feed_the_memory_stores_changes(store: IndexStore, seed: int) -> None:
    await check_against_memory(store, randomized(seed))


async def test_a_watcher_resumes_after_an_entry_and_unknown_ids_are_gone(
    store: IndexStore,
) -> None:
    got = await check_against_memory(store, scripted())
    hub = await store.change_feed()
    for k in (0, 5, len(got) - 2, len(got) - 1):
        resumed = hub.subscribe(after=got[k].id)
        assert drain(resumed) == got[k + 1 :]
        hub.unsubscribe(resumed)
    only_b = hub.subscribe(after=got[0].id, pods=frozenset({B.pod}))
    assert drain(only_b) == [e for e in got[1:] if e.change.pod == B.pod]
    for unknown in ("nobody/0@1-0.0", "12345678.0", "garbage", f"{got[-1].id}x"):
        with pytest.raises(HistoryGone):
            hub.subscribe(after=unknown)


async def test_expired_residencies_are_fed_as_drops_not_losses(store: IndexStore) -> None:
    """An expiry ends each dropped residency holding blocks with one row (all its blocks
    removed, none lost), in a record of its worker; an empty one publishes nothing."""
    got = await check_against_memory(
        store,
        [
            (A, Batch(0, 10.0, [EntriesStored([1, 2], "GPU", 0, "old"),
                                EntriesStored([1], "GPU", 0, "shared")])),
            (A, Batch(1, 11.0, [EntriesStored([3], "GPU", 0, "empty"), EntriesRemoved([3])])),
            (B, Batch(0, 12.0, [EntriesStored([1], "CPU", 0, "old")])),
            (A, Batch(2, 200.0, [EntriesStored([1], "GPU", 0, "shared")])),
            (A, "expire"),
        ],
    )  # fmt: skip
    last = {w: changes[-1] for w, changes in per_worker(got).items()}
    assert {
        w: (c.session_id, c.added, c.removed, c.blocks, c.lost)
        for w, c in last.items()
        if isinstance(c, ResidencyChange)
    } == {A: ("old", 0, 2, 0, 0), B: ("old", 0, 1, 0, 0)}


async def test_every_change_feed_call_returns_the_same_hub(store: IndexStore) -> None:
    hub = await store.change_feed()
    assert await store.change_feed() is hub


async def test_residency_changes_say_what_eviction_took(store: IndexStore) -> None:
    """`lost`: every removal of a batch (evictions, a clear) and of clear_worker is a loss;
    the stale policy's drops are not."""
    got = await check_against_memory(
        store,
        [
            (A, Batch(0, 1.0, [EntriesStored([1, 2, 3], "GPU", 0, "s"), EntriesStored([3], None)])),
            (A, Batch(1, 2.0, [EntriesRemoved([1, 3]), EntriesStored([4], "GPU", 0, "t")])),
            (A, "mark"),
            (A, Batch(2, 3.0, [EntriesStored([4], "GPU", 0, "t")])),  # reconfirms 4
            (A, "drop"),  # s loses 2, not to eviction
            (A, Batch(3, 4.0, [EntriesStored([5, 6], "GPU", 0, "s"), WorkerCleared()])),
            (A, Batch(4, 5.0, [EntriesStored([7], "GPU", 0, "s")])),
            (A, "clear"),
        ],
    )
    rows = [
        (c.session_id, c.added, c.removed, c.blocks, c.lost)
        for c in (e.change for e in got)
        if isinstance(c, ResidencyChange)
    ]
    assert rows == [
        ("s", 3, 0, 3, 0),
        ("s", 0, 2, 1, 2),  # 1 and 3 evicted
        ("t", 1, 0, 1, 0),
        ("s", 0, 1, 0, 0),  # the drop
        ("s", 2, 2, 0, 2),  # stored, then the clear
        ("t", 0, 1, 0, 1),
        ("s", 1, 0, 1, 0),
        ("s", 0, 1, 0, 1),  # clear_worker
    ]
