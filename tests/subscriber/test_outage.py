"""A store outage seen from ingest: buffer (bounded), say why, apply in order when it returns.

The store wrapper fails every call while `down`, as a stopped Redis would; the memory store
itself never fails.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
import structlog
from prometheus_client import REGISTRY

from kvsi.store.memory import MemoryStore
from kvsi.store.model import ApplyOutcome, Batch, Fence, WorkerKey, WorkerState, WorkerStatus
from kvsi.subscriber.drops import DropReason
from kvsi.subscriber.gate import UNAPPLIABLE_AFTER, StoreGate, UnappliableError
from tests.subscriber.conftest import FAST, RigFactory
from tests.subscriber.peers import payload, running, stored
from tests.subscriber.stores import RecordingStore
from tests.waiting import eventually

WORKER = WorkerKey("pod-a", 0)
OUTAGE = replace(FAST, store_retry_max=0.05)


async def test_the_gate_waits_out_an_outage_and_reports_it() -> None:
    store = RecordingStore()
    gate = StoreGate(store, retry_max_seconds=0.05)
    store.down = True
    pending = asyncio.create_task(gate.apply(WORKER, Batch(0, 1.0, [])))
    await asyncio.sleep(0.2)
    assert not pending.done()
    assert not gate.available and store.refused >= 2
    (reason,) = gate.reasons()
    assert "index store unavailable" in reason and "StoreDownError" in reason
    assert REGISTRY.get_sample_value("kvsi_store_available") == 0
    errors = REGISTRY.get_sample_value("kvsi_store_errors_total", {"operation": "apply"})
    assert errors is not None and errors >= 2
    store.down = False
    await asyncio.wait_for(pending, 2)
    assert gate.available and gate.reasons() == [] and gate.recovered_at > 0
    assert REGISTRY.get_sample_value("kvsi_store_available") == 1
    assert store.seqs(WORKER) == [0]


async def test_a_programming_error_is_said_once_with_its_traceback_not_as_an_outage() -> None:
    """A store call raising a bug (here a TypeError, as a compiled module does on a value of
    the wrong type) is retried like an outage, so nothing is lost, but logged once as what it
    is, with its traceback, and /readyz names it."""
    store = RecordingStore()
    gate = StoreGate(store, retry_max_seconds=0.02)
    store.fails_with = TypeError("list object expected; got tuple")

    async def retried() -> bool:
        return store.refused >= 4

    with structlog.testing.capture_logs() as logged:
        pending = asyncio.create_task(gate.apply(WORKER, Batch(0, 1.0, [])))
        await eventually(retried)
        (reason,) = gate.reasons()
        store.fails_with = None
        await asyncio.wait_for(pending, 2)
    assert "programming error" in reason and "TypeError: list object expected" in reason
    errors = [e for e in logged if e["event"] == "store.call_error"]
    assert len(errors) == 1 and errors[0]["log_level"] == "error", logged
    assert isinstance(errors[0]["exc_info"], TypeError)
    assert [e["event"] for e in logged].count("store.unavailable") == 1
    assert gate.available and store.seqs(WORKER) == [0]


async def test_batches_buffered_during_an_outage_apply_in_order_when_it_ends(
    rig: RigFactory,
) -> None:
    r = await rig(options=OUTAGE)
    await r.publisher.send(payload([stored([0])]))
    await r.applied_through(0)
    r.store.down = True
    for i in range(1, 21):
        await r.publisher.send(payload([stored([i])]))

    async def buffering() -> bool:
        # The inbox and what the applier took from it (the first, being retried, or a run).
        return r.stream.read_counters().queued == 20

    await eventually(buffering)
    (reason,) = r.stream.readiness_reasons()
    assert "20 batches buffered during the index store outage" in reason
    r.store.down = False
    await r.applied_through(20)
    assert r.store.seqs(WORKER) == list(range(21))
    assert r.stream.readiness_reasons() == []
    assert r.stream.counters.batches_lost == 0
    await r.state(WorkerState.LIVE)


async def test_an_outage_longer_than_the_buffer_is_repaired_by_replay(rig: RigFactory) -> None:
    r = await rig(options=replace(OUTAGE, queue_size=5))
    await r.publisher.send(payload([stored([0])]))
    await r.applied_through(0)
    r.store.down = True
    for i in range(1, 41):
        await r.publisher.send(payload([stored([i])]))

    async def overflowing() -> bool:
        return r.stream.inbox.overflowed > 0

    await eventually(overflowing)
    reasons = r.stream.readiness_reasons()
    assert any("buffered during the index store outage" in x for x in reasons)
    assert any("dropped by a full ingest queue" in x for x in reasons)
    r.store.down = False
    await r.applied_through(40)
    assert r.store.seqs(WORKER) == list(range(41)), "in order, once, the hole replayed"
    c = r.stream.read_counters()
    assert c.queue_overflow == r.stream.inbox.overflowed > 0
    assert c.batches_lost == 0 and c.batches_replayed > 0
    (mark, *_) = [s for w, s in r.store.statuses if "dropped by a full ingest queue" in s.detail]
    assert mark.state is WorkerState.DEGRADED, "marked before the repair ran"
    await r.state(WorkerState.LIVE)
    assert r.stream.readiness_reasons() == []


async def test_an_apply_raising_one_programming_error_every_try_is_given_up() -> None:
    store = RecordingStore()
    gate = StoreGate(store, retry_max_seconds=0.02)
    store.fails_with = TypeError("list object expected; got tuple")
    with (
        structlog.testing.capture_logs() as logged,
        pytest.raises(UnappliableError, match="5 tries: apply: TypeError") as raised,
    ):
        await asyncio.wait_for(gate.apply(WORKER, Batch(0, 1.0, [])), 5)
    assert isinstance(raised.value.__cause__, TypeError)
    assert store.refused == UNAPPLIABLE_AFTER == 5
    assert [e["event"] for e in logged].count("store.call_error") == 1
    (reason,) = gate.reasons()
    assert "programming error" in reason, "said until a call lands again"
    store.fails_with = None
    await gate.apply(WORKER, Batch(1, 1.0, []))
    assert gate.available and gate.reasons() == []


async def test_an_outage_or_a_changing_error_is_never_given_up() -> None:
    """Only the same programming error every time gives an apply up: an outage (the store
    down) or errors that differ keep it waiting, however long."""
    store = RecordingStore()
    gate = StoreGate(store, retry_max_seconds=0.01)
    store.down = True
    pending = asyncio.create_task(gate.apply(WORKER, Batch(0, 1.0, [])))

    async def refused(n: int) -> bool:
        return store.refused >= n

    await eventually(lambda: refused(3 * UNAPPLIABLE_AFTER))
    store.down = False
    for i in range(3 * UNAPPLIABLE_AFTER):
        store.fails_with = TypeError(f"error {i % 2}")
        await eventually(lambda n=store.refused + 1: refused(n))
    store.fails_with = None
    await asyncio.wait_for(pending, 2)
    assert store.seqs(WORKER) == [0]


@pytest.mark.parametrize("late", [False, True], ids=["live", "replayed run"])
async def test_a_batch_the_store_cannot_take_is_lost_and_the_stream_goes_on(
    rig: RigFactory, late: bool
) -> None:
    """Seq 3 raises the same TypeError on every try: it is counted and lost (DEGRADED, the
    stale policy flagging what it may have removed), every other batch applies, in order;
    replayed, the run it came in goes again batch by batch."""
    store = RecordingStore()
    store.poisoned[3] = TypeError("unhashable type: 'list'")
    r = await rig(store=store, options=OUTAGE, start=not late)
    with structlog.testing.capture_logs() as logged:
        if late:
            for i in range(7):
                await r.publisher.send(payload([stored([i])]), deliver=False)
            async with running(r.stream):
                await r.applied_through(6)
                await r.state(WorkerState.DEGRADED)
        else:
            for i in range(7):
                await r.publisher.send(payload([stored([i])]))
            await r.applied_through(6)
            await r.state(WorkerState.DEGRADED)
    applied = [seq for _, seq, outcome in store.applied if outcome is ApplyOutcome.APPLIED]
    assert applied == [0, 1, 2, 4, 5, 6], "a run's retries find what landed a duplicate"
    assert r.stream.counters.drops == {DropReason.APPLY_ERROR: 1}
    status = (await r.view()).status
    assert status.batches_lost == 1
    assert "batch seq 3 could not be applied" in status.detail
    assert "TypeError: unhashable type" in status.detail
    (line,) = [e for e in logged if e["event"] == "stream.batch_unappliable"]
    assert line["seq"] == 3 and isinstance(line["exc_info"], TypeError)
    if late:
        assert [0, 1, 2, 3, 4, 5, 6] in store.runs, "the replay stored them as one run first"


async def test_giving_up_leaves_another_streams_outage_reported() -> None:
    """pod-a's batch raises a bug, planned before any I/O, while pod-b waits out a real
    outage: pod-a's is given up, and the gate still says the store is down."""

    class Store(RecordingStore):
        async def apply(
            self, worker: WorkerKey, batch: Batch, expect: Fence | None = None
        ) -> ApplyOutcome:
            raise TypeError("poison") if worker.pod == "pod-a" else ConnectionError("down")

    gate = StoreGate(Store(), retry_max_seconds=0.02)
    waiting = asyncio.create_task(gate.apply(WorkerKey("pod-b", 0), Batch(0, 1.0, [])))
    try:
        with pytest.raises(UnappliableError):
            await gate.apply(WORKER, Batch(7, 1.0, []))
        assert not gate.available
        assert any("index store" in reason for reason in gate.reasons())
        assert REGISTRY.get_sample_value("kvsi_store_available") == 0
    finally:
        waiting.cancel()


async def test_a_restart_batch_given_up_is_lost_not_a_clean_restart(rig: RigFactory) -> None:
    """A new engine's seq 0 that the store cannot take: the worker stays DEGRADED (what the
    old engine held is flagged, never shown exact), and no restart is counted."""
    store = RecordingStore()
    r = await rig(store=store, options=OUTAGE)
    now = time.time()
    for i in range(3):
        await r.publisher.send(payload([stored([100 + i])], ts=now + i))
    await r.applied_through(2)
    store.poisoned[0] = TypeError("bad restart batch")
    r.publisher.sent.clear()  # a new engine: empty replay buffer, seq from 0, later clock
    r.publisher.seq = 0
    await r.publisher.send(payload([stored([1])], ts=now + 100))

    async def given_up() -> bool:
        return r.stream.counters.drops.get(DropReason.APPLY_ERROR) == 1

    await eventually(given_up)
    await r.state(WorkerState.DEGRADED)
    await r.publisher.send(payload([stored([2])], ts=now + 101))
    await r.applied_through(1)
    status = (await r.view()).status
    assert status.state is WorkerState.DEGRADED and status.batches_lost == 1
    assert r.stream.counters.restarts == 0


async def test_a_status_the_fence_refuses_is_counted_and_logged_and_the_newer_one_kept() -> None:
    """A status fenced at an older roster epoch than the store holds (another replica owns the
    worker at a newer view) is not written: the gate counts and logs it with its epoch, and
    the store keeps the newer owner's status. One the store takes is neither."""
    store = MemoryStore()
    gate = StoreGate(store)
    before = REGISTRY.get_sample_value("kvsi_statuses_refused_total") or 0.0
    live = WorkerStatus(WorkerState.LIVE, since=2.0)
    connecting = WorkerStatus(WorkerState.CONNECTING, since=3.0)
    with structlog.testing.capture_logs() as logged:
        gate.status_epoch = 8
        await gate.publish_status(lambda: (WORKER, live))
        gate.status_epoch = 7
        await gate.publish_status(lambda: (WORKER, connecting))
    refused = [line for line in logged if line["event"] == "subscriber.status_refused"]
    assert [(line["worker"], line["epoch"]) for line in refused] == [(str(WORKER), 7)]
    assert REGISTRY.get_sample_value("kvsi_statuses_refused_total") == before + 1
    assert (await store.worker_states())[WORKER] is WorkerState.LIVE
