"""Gaps, replays, restarts and losses of one stream, over real sockets on loopback."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from kvsi.store.model import ApplyOutcome, WorkerKey, WorkerState
from kvsi.subscriber import wire
from kvsi.subscriber.drops import DropReason
from tests.subscriber.conftest import FAST, RigFactory
from tests.subscriber.peers import payload, removed, running, stored
from tests.subscriber.stores import RecordingStore
from tests.waiting import eventually

WORKER = WorkerKey("pod-a", 0)


async def blocks(store: RecordingStore) -> set[int | bytes]:
    page = await store.inner.worker_blocks(
        "pod-a", dp_rank=None, medium=None, limit=1000, cursor=None
    )
    return set(page.items) if page else set()


@pytest.mark.parametrize("legacy", [False, True], ids=["0.26+", "pre-0.26"])
async def test_a_gap_is_repaired_by_replay_before_the_message_that_revealed_it(
    rig: RigFactory, legacy: bool
) -> None:
    r = await rig(legacy=legacy)
    for i in range(15):
        await r.publisher.send(payload([stored([i])]), deliver=not 5 <= i < 10)
    await r.applied_through(14)
    assert r.store.seqs(WORKER) == list(range(15))
    assert {o for _, _, o in r.store.applied} == {ApplyOutcome.APPLIED}
    c = r.stream.counters
    assert (c.gaps, c.batches_missed, c.batches_lost) == (1, 5, 0)
    assert c.batches_replayed >= 5
    assert await blocks(r.store) == set(range(15))
    assert (await r.view()).status.state is WorkerState.LIVE


async def test_the_stored_status_carries_the_gap_and_the_replay(rig: RigFactory) -> None:
    """What /v1/pods shows of the stream: written with the status, at least every audit."""
    r = await rig(options=replace(FAST, index_audit=0.1))
    for i in range(15):
        await r.publisher.send(payload([stored([i])]), deliver=not 5 <= i < 10)
    await r.applied_through(14)

    async def counted() -> bool:
        status = (await r.view()).status
        return (status.gaps, status.restarts, status.lag_batches) == (1, 0, 0) and (
            status.replays >= 2  # the catch-up at connect, and the gap's
        )

    await eventually(counted)


async def test_live_messages_during_a_slow_replay_are_held_then_applied_in_order_once(
    rig: RigFactory,
) -> None:
    r = await rig()
    assert r.router is not None
    r.router.delay = 0.01
    for i in range(20):
        await r.publisher.send(payload([stored([i])]), deliver=not 5 <= i < 15)
    for i in range(20, 60):  # while the replay trickles in
        await r.publisher.send(payload([stored([i])]))
        await asyncio.sleep(0.002)
    await r.applied_through(59)
    assert r.store.seqs(WORKER) == list(range(60)), "each batch once, in seq order"
    assert ApplyOutcome.DUPLICATE not in {o for _, _, o in r.store.applied}
    held_and_skipped = r.stream.counters.batches.get(ApplyOutcome.DUPLICATE, 0)
    assert held_and_skipped > 0, "the replay covered live messages that were held meanwhile"
    assert await blocks(r.store) == set(range(60))


async def test_an_engine_restart_empties_the_worker_and_is_no_gap(rig: RigFactory) -> None:
    r = await rig()
    now = time.time()
    for i in range(5):
        await r.publisher.send(payload([stored([100 + i])], ts=now + i))
    await r.applied_through(4)
    r.publisher.sent.clear()  # a new engine: empty replay buffer, seq from 0, later clock
    r.publisher.seq = 0
    await r.publisher.send(payload([stored([1])], ts=now + 100))
    await r.publisher.send(payload([stored([2])], ts=now + 101))

    async def restarted() -> bool:
        return await blocks(r.store) == {1, 2}

    await eventually(restarted)
    c = r.stream.counters
    assert (c.restarts, c.gaps, c.batches_lost) == (1, 0, 0)
    assert r.store.applied[-2][1:] == (0, ApplyOutcome.RESTARTED)


async def test_a_restart_seen_late_replays_the_new_engine_from_zero(rig: RigFactory) -> None:
    r = await rig()
    now = time.time()
    for i in range(8):
        await r.publisher.send(payload([stored([100 + i])], ts=now + i))
    await r.applied_through(7)
    r.publisher.sent.clear()
    r.publisher.seq = 0
    for i in range(4):  # the new engine's first batches never reach the SUB
        await r.publisher.send(payload([stored([i])], ts=now + 100 + i), deliver=i == 3)

    async def rebuilt() -> bool:
        return await blocks(r.store) == {0, 1, 2, 3}

    await eventually(rebuilt)
    assert r.router is not None
    assert r.router.requests[-2:] == [7, 0], "from the last applied seq, then from 0"
    c = r.stream.counters
    assert (c.restarts, c.gaps, c.batches_lost) == (1, 0, 0)
    assert (await r.view()).status.state is WorkerState.LIVE


async def test_without_replay_a_gap_degrades_the_worker_and_the_stale_policy_runs(
    rig: RigFactory,
) -> None:
    r = await rig(replay=False, options=replace(FAST, unconfirmed_ttl=0.3))
    await r.publisher.send(payload([stored([1, 2, 3])]))
    await r.applied_through(0)
    await r.publisher.send(payload([removed([1])]), deliver=False)  # lost: 1 was evicted
    await r.publisher.send(payload([stored([2, 9])]))  # 2 is reconfirmed, 9 is new
    await r.state(WorkerState.DEGRADED)
    view = await r.view()
    assert view.status.batches_lost == 1
    assert "seqs 1..1 lost: no replay endpoint" in view.status.detail
    assert view.unconfirmed == 2  # 1 and 3: held, but nothing said they are still there
    assert await blocks(r.store) == {1, 2, 3, 9}

    async def dropped() -> bool:
        return r.stream.counters.unconfirmed_dropped == 2

    await eventually(dropped)
    assert await blocks(r.store) == {2, 9}, "under-reports (3), never over-reports (1)"
    assert "2 entries not reconfirmed" in (await r.view()).status.detail
    assert (await r.view()).status.state is WorkerState.DEGRADED

    await r.publisher.send(payload([stored([5]), removed([2])]))
    await r.publisher.send(payload([wire.AllBlocksCleared(), stored([7])]))
    await r.state(WorkerState.LIVE)
    assert await blocks(r.store) == {7}


async def test_a_replay_that_starts_late_loses_the_rest_and_says_so(rig: RigFactory) -> None:
    r = await rig()
    assert r.router is not None
    r.router.first = 8
    for i in range(12):
        await r.publisher.send(payload([stored([i])]), deliver=not 4 <= i < 10)
    await r.applied_through(11)
    await r.state(WorkerState.DEGRADED)
    view = await r.view()
    assert view.status.batches_lost == 4
    assert "seqs 4..7 lost: the publisher's replay buffer starts at seq 8" in view.status.detail
    assert r.store.seqs(WORKER) == [0, 1, 2, 3, 8, 9, 10, 11]


async def test_a_failed_replay_degrades_the_worker_with_the_failure(rig: RigFactory) -> None:
    r = await rig(options=replace(FAST, replay_timeout=0.1, replay_attempts=2))
    assert r.router is not None
    await r.publisher.send(payload([stored([0])]))
    await r.applied_through(0)
    r.router.silent = True
    await r.publisher.send(payload([stored([1])]), deliver=False)
    await r.publisher.send(payload([stored([2])]))
    await r.state(WorkerState.DEGRADED)
    view = await r.view()
    assert "failed after 2 attempts" in view.status.detail
    assert view.status.batches_lost == 1
    assert r.stream.counters.replay_failures == {"timeout": 1}
    assert r.stream.counters.replays.get("failed") == 1


async def test_an_unreadable_batch_consumes_its_seq_and_is_counted_lost(rig: RigFactory) -> None:
    r = await rig()
    await r.publisher.send(payload([stored([0])]))
    await r.publisher.send(b"\xc1 not msgpack")
    await r.publisher.send(payload([stored([2])]))
    await r.applied_through(2)
    await r.state(WorkerState.DEGRADED)
    assert r.stream.counters.drops == {DropReason.NOT_MSGPACK: 1}
    assert (await r.view()).status.batches_lost == 1
    assert r.router is not None and len(r.router.requests) <= 1, "no replay loop on bad input"


async def test_a_late_joiner_asks_for_the_history_without_waiting_for_traffic(
    rig: RigFactory,
) -> None:
    r = await rig(start=False)
    for i in range(10):
        await r.publisher.send(payload([stored([i])]), deliver=False)  # before we subscribe
    async with running(r.stream):
        await r.applied_through(9)
    assert r.router is not None and r.router.requests[0] == 0
    assert r.store.seqs(WORKER) == list(range(10))
    assert r.stream.counters.batches_lost == 0


async def test_a_restarted_sidecar_resumes_from_the_store_fence(rig: RigFactory) -> None:
    r = await rig()
    for i in range(5):
        await r.publisher.send(payload([stored([i])]))
    await r.applied_through(4)
    await r.publisher.send(payload([stored([5])]))  # in flight while the sidecar stops
    await asyncio.sleep(0.05)
    r.stream = r.new_stream()  # the old stream is cancelled when the test ends
    for i in range(6, 10):
        await r.publisher.send(payload([stored([i])]), deliver=False)
    async with running(r.stream):
        await r.applied_through(9)
    assert r.router is not None and r.router.requests[-1] == 5
    assert r.store.seqs(WORKER) == list(range(10))
    assert r.stream.counters.batches_lost == 0


async def test_the_rank_a_batch_names_replaces_the_assumed_one(rig: RigFactory) -> None:
    r = await rig(dp_rank=0)
    await r.publisher.send(payload([stored([1])], rank=1))

    async def only_rank_one() -> bool:
        workers = {(w.pod, w.dp_rank) for w in await r.store.inner.list_workers()}
        return workers == {("pod-a", 1)}

    await eventually(only_rank_one)
    assert r.stream.worker == WorkerKey("pod-a", 1)
    await r.publisher.send(payload([stored([2])], rank=2))
    await r.state(WorkerState.DEGRADED)
    assert r.stream.counters.drops == {DropReason.RANK_MISMATCH: 1}
    assert await blocks(r.store) == {1}


async def test_a_full_queue_drops_the_newest_and_replay_repairs_it(rig: RigFactory) -> None:
    store = RecordingStore()
    store.delay = 0.003
    r = await rig(store=store, options=replace(FAST, queue_size=4))
    for i in range(60):
        await r.publisher.send(payload([stored([i])]))
    lag_seen: list[tuple[int, float]] = []

    async def caught_up() -> bool:
        c = r.stream.read_counters()
        lag_seen.append((c.lag_batches, c.lag_seconds))
        return c.applied_seq == 59

    await eventually(caught_up)
    c = r.stream.read_counters()
    assert c.queue_overflow > 0
    assert any(batches > 0 for batches, _ in lag_seen), "lag in batches seen while behind"
    assert any(age > 0 for _, age in lag_seen), "age of the oldest unapplied batch seen"
    assert r.store.seqs(WORKER) == list(range(60))
    assert c.batches_lost == 0 and c.lag_batches == 0
    await r.state(WorkerState.LIVE)
