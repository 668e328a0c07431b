"""WorkerStream over real ZMQ sockets on loopback: order, workers, bad frames, restarts, metrics."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from prometheus_client import REGISTRY, generate_latest

from kvsi.store.model import WorkerKey, WorkerState
from kvsi.subscriber import metrics, wire
from kvsi.subscriber.applier import REPLAY_RUN_MAX
from kvsi.subscriber.drops import DropReason
from kvsi.subscriber.receiver import DRAIN_MAX
from tests.subscriber.conftest import RigFactory
from tests.subscriber.peers import Publisher, payload, removed, running, stored
from tests.subscriber.stores import RecordingStore
from tests.waiting import eventually


async def session_blocks(store: RecordingStore, session: str) -> int:
    view = await store.inner.get_session(session)
    return view.total_blocks if view else -1


async def test_batches_apply_in_order_and_name_the_worker_by_rank(rig: RigFactory) -> None:
    r = await rig(replay=False)
    await r.publisher.send(payload([stored([1, 2, 2**64 - 1])], rank=1))
    await r.publisher.send(payload([removed([2])], rank=1))
    await r.applied_through(1)
    (worker,) = await r.store.inner.list_workers()
    assert (worker.pod, worker.dp_rank, worker.last_seq, worker.blocks) == ("pod-a", 1, 1, 2)
    assert await session_blocks(r.store, "s1") == 2


async def test_a_backlog_read_in_bursts_is_applied_once_each_in_seq_order(rig: RigFactory) -> None:
    r = await rig(replay=False)
    backlog = 3 * DRAIN_MAX + 5
    for n in range(backlog):
        await r.publisher.send(payload([stored([n])]))
    await r.applied_through(backlog - 1)
    assert r.store.seqs(r.worker) == list(range(backlog))
    counters = r.stream.read_counters()
    assert (counters.messages, counters.block_events) == (backlog, backlog)
    assert (counters.gaps, counters.queue_overflow, counters.queued) == (0, 0, 0)
    assert await session_blocks(r.store, "s1") == backlog


async def test_bad_frames_are_counted_and_the_stream_goes_on(rig: RigFactory) -> None:
    r = await rig(replay=False)
    await r.publisher.sock.send_multipart([b"kv", b"\x00" * 8])
    await r.publisher.sock.send_multipart([b"kv", b"\x00" * 3, payload([])])
    await r.publisher.send(b"\xc1 not msgpack")
    await r.publisher.send(payload([stored([7])]))
    await r.applied_through(1)
    assert await session_blocks(r.store, "s1") == 1
    assert r.stream.counters.drops == {
        DropReason.FRAME_COUNT: 1,
        DropReason.SEQ_FRAME: 1,
        DropReason.NOT_MSGPACK: 1,
    }
    assert r.stream.counters.messages == 4


async def test_topic_filter_keeps_other_topics_out(rig: RigFactory) -> None:
    r = await rig(replay=False, start=False)
    r.spec = replace(r.spec, topic="kv@pod-a")
    r.stream = r.new_stream()
    async with running(r.stream):
        await r.publisher.probe(r.stream)
        r.publisher.topic = b"kv@pod-b@m"
        await r.publisher.send(payload([stored([1], "other")]))
        r.publisher.topic = b"kv@pod-a@m"
        await r.publisher.send(payload([stored([2], "mine")]))

        async def mine() -> bool:
            return await session_blocks(r.store, "mine") == 1

        await eventually(mine)
    assert await session_blocks(r.store, "other") == -1


async def test_publisher_restart_on_same_port_is_visible_and_empties_the_worker(
    rig: RigFactory,
) -> None:
    r = await rig(replay=False)
    for i in range(5):
        await r.publisher.send(payload([stored([100 + i], "old")]))
    await r.applied_through(4)
    endpoint = r.spec.endpoint
    r.publisher.close()
    await r.state(WorkerState.DISCONNECTED)
    assert "disconnected" in (await r.view()).status.detail
    r.publisher = Publisher(r.ctx, endpoint)  # a new engine: seq from 0, empty cache
    await r.state(WorkerState.LIVE)
    await r.publisher.probe(r.stream)
    await r.publisher.send(payload([stored([1], "new")]))

    async def new_applied() -> bool:
        return await session_blocks(r.store, "new") == 1

    await eventually(new_applied)
    assert await session_blocks(r.store, "old") == 0
    assert r.stream.counters.restarts == 1 and r.stream.counters.gaps == 0


async def test_metrics_per_worker_and_fleet_totals_outlive_the_stream(rig: RigFactory) -> None:
    r = await rig(replay=False, start=False)
    worker = str(WorkerKey("pod-a", 0))
    before = REGISTRY.get_sample_value("kvsi_fleet_block_events_total") or 0.0
    async with running(r.stream):
        await r.publisher.probe(r.stream)
        await r.publisher.send(payload([stored([1, 2, 3]), {"type": "Nope"}]))  # type: ignore[list-item]
        await r.publisher.send(payload([wire.AllBlocksCleared()]))
        await r.applied_through(1)
        text = generate_latest().decode()
        assert f'kvsi_batches_total{{outcome="applied",worker="{worker}"}}' in text
        assert f'kvsi_worker_applied_seq{{worker="{worker}"}} 1.0' in text
        assert f'kvsi_worker_lag_batches{{worker="{worker}"}} 0.0' in text
        assert f'kvsi_publisher_connected{{worker="{worker}"}} 1.0' in text
        assert "kvsi_fleet_workers_connected" in text
        assert r.stream in metrics.INGEST._sources
    await asyncio.sleep(0)
    after = REGISTRY.get_sample_value("kvsi_fleet_block_events_total")
    assert after == before + 3, "a stopped stream's counters are kept"
    drops = REGISTRY.get_sample_value(
        "kvsi_decode_drops_total", {"worker": worker, "reason": "unknown_event"}
    )
    assert drops is not None and drops >= 1


async def test_a_connected_worker_is_live_only_once_what_its_publisher_buffers_is_applied(
    rig: RigFactory,
) -> None:
    r = await rig(start=False)
    for i in range(5):
        await r.publisher.send(payload([stored([30 + i])]), deliver=False)  # replay buffer
    assert r.router is not None
    r.router.delay = 0.1  # a slow replay: half a second between connect and exact
    seen: list[tuple[WorkerState, int | None]] = []
    async with running(r.stream):
        while not seen or seen[-1][0] is not WorkerState.LIVE:
            listed = await r.store.inner.list_workers()
            if listed:
                fence = await r.store.inner.fence(r.worker)
                seen.append((listed[0].status.state, None if fence is None else fence.seq))
            await asyncio.sleep(0.02)
    assert seen[-1] == (WorkerState.LIVE, 4)
    assert (WorkerState.CONNECTING, None) in seen


async def test_a_replayed_backlog_is_stored_in_runs_in_seq_order(rig: RigFactory) -> None:
    """What a publisher buffered before the stream started arrives by replay and goes to
    the store in runs of REPLAY_RUN_MAX (a live backlog in runs of its own); a batch that
    does not simply follow (a gap the replay itself shows) is decided alone, between runs."""
    r = await rig(start=False)
    buffered = 2 * REPLAY_RUN_MAX + 5
    for n in range(buffered):
        await r.publisher.send(payload([stored([100 + n])]), deliver=False)
    r.publisher.seq += 3  # three seqs the publisher no longer holds
    for n in range(4):
        await r.publisher.send(payload([stored([10_000 + n])]), deliver=False)
    last = buffered + 3 + 3
    async with running(r.stream):
        await r.applied_through(last)
    assert r.store.runs == [
        list(range(0, REPLAY_RUN_MAX)),
        list(range(REPLAY_RUN_MAX, 2 * REPLAY_RUN_MAX)),
        list(range(2 * REPLAY_RUN_MAX, buffered)),
        [buffered + 3],
        list(range(buffered + 4, last + 1)),
    ]
    counters = r.stream.read_counters()
    assert (counters.batches_replayed, counters.gaps) == (buffered + 4, 1)
    assert await session_blocks(r.store, "s1") == buffered + 4


async def test_live_batches_observe_their_delay_from_engine_time_replayed_ones_do_not(
    rig: RigFactory,
) -> None:
    """`kvsi_index_delay_seconds`: a live batch stamped 5 s ago counts in the 10 s bucket
    and not in the 2.5 s one, one stamped ahead of this clock counts as 0; a replayed batch
    (however old) does not count."""

    def sample(suffix: str, le: str | None = None) -> float:
        labels = None if le is None else {"le": le}
        found = REGISTRY.get_sample_value(f"kvsi_index_delay_seconds_{suffix}", labels)
        return found or 0.0

    r = await rig(start=False)
    await r.publisher.send(payload([stored([1])], ts=time.time() - 30), deliver=False)
    count, total, zero, late, slow = (
        sample("count"),
        sample("sum"),
        sample("bucket", "0.001"),
        sample("bucket", "2.5"),
        sample("bucket", "10.0"),
    )
    async with running(r.stream):
        await r.applied_through(0)
        assert sample("count") == count  # the replayed batch
        await r.publisher.send(payload([stored([2])], ts=time.time() - 5))
        await r.publisher.send(payload([stored([3])], ts=time.time() + 60))
        await r.applied_through(2)
    assert sample("count") == count + 2
    assert 5 <= sample("sum") - total < 30  # the one ahead adds 0, not -60
    assert sample("bucket", "0.001") == zero + 1
    assert sample("bucket", "2.5") == late + 1
    assert sample("bucket", "10.0") == slow + 2
