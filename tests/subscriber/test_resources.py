"""A stream that meets a resource limit (a ZMQ context without a free socket) shows it: its
worker `degraded` with the reason, counted, `/readyz` failing; it opens its sockets once
they free up and the worker is then exact, nothing lost. The room a process has for streams
follows its limits (sockets.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from kvsi.store.memory import MemoryStore
from kvsi.store.model import WorkerKey, WorkerState
from kvsi.subscriber.gate import StoreGate
from kvsi.subscriber.pool import StreamPool
from kvsi.subscriber.sockets import (
    FILES_KEPT,
    Limits,
    ResourceError,
    ResourceReason,
    room_for,
    sized_context,
)
from kvsi.subscriber.stream import IngestOptions, PublisherSpec, WorkerStream
from tests.subscriber.conftest import FAST, Rig, RigFactory
from tests.subscriber.peers import Publisher, ReplayRouter, payload, running, stored, tcp
from tests.waiting import eventually


@pytest.fixture
async def tight() -> AsyncIterator[zmq.asyncio.Context]:
    """A context for the stream under test with room for 4 sockets: a stream's SUB, its
    monitor's two PAIR ends, and one replay DEALER."""
    context = zmq.asyncio.Context()
    context.set(zmq.MAX_SOCKETS, 4)
    try:
        yield context
    finally:
        context.destroy(linger=0)


async def until_state(r: Rig, state: WorkerState) -> None:
    """Wait until the worker is listed in `state` (listed at all: a stream that never
    stored a status leaves it unlisted)."""

    async def reached() -> bool:
        listed = await r.store.inner.list_workers()
        return any(w.status.state is state for w in listed)

    await eventually(reached)


def hog(ctx: zmq.asyncio.Context, sockets: int) -> list[zmq.asyncio.Socket]:
    """Take `sockets` of the context's sockets, as other streams would."""
    return [ctx.socket(zmq.PAIR) for _ in range(sockets)]


async def test_a_stream_without_its_sockets_is_degraded_counted_and_recovers(
    rig: RigFactory, tight: zmq.asyncio.Context
) -> None:
    r = await rig(start=False)
    for i in range(3):
        await r.publisher.send(payload([stored([10 + i])]), deliver=False)  # replay buffer
    held = hog(tight, 2)  # the SUB opens, its monitor cannot
    stream = WorkerStream(r.spec, StoreGate(r.store), tight, options=FAST)
    async with running(stream):
        await until_state(r, WorkerState.DEGRADED)
        view = await r.view()
        assert "cannot open the live stream's ZMQ sockets" in view.status.detail
        assert "Too many open files" in view.status.detail
        assert stream.counters.resource_failures == {ResourceReason.TOO_MANY_OPEN_FILES: 1}
        assert stream.read_counters().degraded
        (reason,) = stream.readiness_reasons()
        assert "Too many open files" in reason
        for sock in held:
            sock.close(linger=0)
        await r.applied_through(2)
        await until_state(r, WorkerState.LIVE)
        assert r.store.seqs(r.worker) == [0, 1, 2]
        assert stream.readiness_reasons() == []
        assert stream.counters.resource_failures == {ResourceReason.TOO_MANY_OPEN_FILES: 1}


async def test_a_replay_without_a_socket_waits_degraded_and_loses_nothing(
    rig: RigFactory, tight: zmq.asyncio.Context
) -> None:
    r = await rig(start=False)
    for i in range(5):
        await r.publisher.send(payload([stored([20 + i])]), deliver=False)  # replay buffer
    held = hog(tight, 1)  # the stream's three sockets open, the replay's DEALER cannot
    stream = WorkerStream(r.spec, StoreGate(r.store), tight, options=FAST)
    async with running(stream):
        await until_state(r, WorkerState.DEGRADED)
        assert "cannot open a ZMQ socket to replay from" in (await r.view()).status.detail
        assert r.store.seqs(r.worker) == []
        assert any("Too many open files" in x for x in stream.readiness_reasons())
        held[0].close(linger=0)
        await r.applied_through(4)
        await until_state(r, WorkerState.LIVE)
        view = await r.view()
        assert (view.status.batches_lost, view.status.detail) == (0, "")
        assert r.store.seqs(r.worker) == [0, 1, 2, 3, 4]
        assert stream.counters.resource_failures == {ResourceReason.TOO_MANY_OPEN_FILES: 1}
        assert stream.readiness_reasons() == []


async def test_a_worker_added_past_max_workers_waits_degraded_until_a_place_frees(
    ctx: zmq.asyncio.Context,
) -> None:
    store = MemoryStore()
    pool = StreamPool([], store, IngestOptions(max_workers=2, replay_timeout=0.5))
    publishers = [Publisher(ctx, tcp()) for _ in range(3)]
    routers = [ReplayRouter(ctx, tcp(), p) for p in publishers]
    for i, (publisher, router) in enumerate(zip(publishers, routers, strict=True)):
        router.start()
        await publisher.send(payload([stored([100 + i])]), deliver=False)

    async def states() -> dict[str, WorkerState]:
        return {w.pod: w.status.state for w in await store.list_workers()}

    await pool.start()
    try:
        for i, (publisher, router) in enumerate(zip(publishers, routers, strict=True)):
            endpoint = publisher.sock.getsockopt_string(zmq.LAST_ENDPOINT)
            await pool.add(PublisherSpec(f"pod-{i}", endpoint, router.endpoint))

        async def third_waits() -> bool:
            return await states() == {
                "pod-0": WorkerState.LIVE,
                "pod-1": WorkerState.LIVE,
                "pod-2": WorkerState.DEGRADED,
            }

        await eventually(third_waits)
        (waiting,) = [w for w in await store.list_workers() if w.pod == "pod-2"]
        assert "sized for 2 workers; raise KVSI_MAX_WORKERS" in waiting.status.detail
        assert any("no room for this stream" in r for r in pool.readiness_reasons())
        assert await pool.remove("pod-0", 0)

        async def third_live() -> bool:
            fence = await store.fence(WorkerKey("pod-2", 0))
            return (await states())["pod-2"] is WorkerState.LIVE and fence is not None

        await eventually(third_live)
        assert pool.readiness_reasons() == []
    finally:
        await pool.stop()
        for router in routers:
            await router.close()
        for publisher in publishers:
            publisher.close()


@pytest.mark.parametrize(
    ("limits", "workers", "capacity", "names"),
    [
        (Limits(sockets=10_000, files=100_000, files_hard=100_000), 1000, 1000, "KVSI_MAX_WORKERS"),
        (Limits(sockets=10_000, files=FILES_KEPT + 8 + 40, files_hard=400), 1000, 10, "ulimit -n"),
        (Limits(sockets=16 + 4 + 30, files=100_000, files_hard=100_000), 1000, 10, "socket limit"),
        (Limits(sockets=10_000, files=100, files_hard=100), 1000, 0, "ulimit -n"),
    ],
)
def test_the_room_for_streams_follows_the_tightest_limit_and_names_it(
    limits: Limits, workers: int, capacity: int, names: str
) -> None:
    room = room_for(workers, limits, replays=4)
    assert room.capacity == capacity
    for _ in range(capacity):
        room.take()
    with pytest.raises(ResourceError, match=names) as refused:
        room.take()
    assert refused.value.reason is ResourceReason.NO_ROOM
    room.give_back()
    room.take()


def test_a_sized_context_holds_more_than_libzmqs_default_of_1023_sockets() -> None:
    ctx, limits = sized_context(sockets=3000, files=4000)
    try:
        assert limits.sockets >= 3000
        held = [ctx.socket(zmq.PAIR) for _ in range(1100)]
        for sock in held:
            sock.close(linger=0)
    finally:
        ctx.destroy(linger=0)
    assert limits.files >= min(4000, limits.files_hard)
