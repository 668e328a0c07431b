"""WorkerStream over real ZMQ sockets on loopback: order, workers, bad frames, restarts."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
import zmq
import zmq.asyncio

from store.memory import MemoryStore
from store.model import WorkerKey, WorkerState
from subscriber import wire
from subscriber.drops import DropReason
from subscriber.stream import PublisherSpec, WorkerStream
from tests.waiting import eventually

ENCODER = msgspec.msgpack.Encoder()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def stored(hashes: list[int], session: str | None = "s1") -> wire.BlockStored:
    return wire.BlockStored(
        block_hashes=hashes,  # type: ignore[arg-type]
        parent_block_hash=None,
        token_ids=[0] * 16 * len(hashes),
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        session_id=session,
    )


def payload(
    events: list[wire.KVCacheEvent], rank: int | None = 0, ts: float | None = None
) -> bytes:
    batch = wire.KVEventBatch(ts=ts or time.time(), events=events, data_parallel_rank=rank)
    return ENCODER.encode(batch)


class Publisher:
    """A bare PUB socket speaking vLLM's live framing, for driving one stream."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.seq = 0

    async def send(self, body: bytes, topic: bytes = b"kv@pod-a@m") -> None:
        await self.sock.send_multipart([topic, self.seq.to_bytes(8, "big"), body])
        self.seq += 1

    def close(self) -> None:
        self.sock.close(linger=0)


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    yield context
    context.term()


async def start(stream: WorkerStream) -> asyncio.Task[None]:
    task = asyncio.create_task(stream.run())
    await asyncio.sleep(0.2)  # let the SUB connect and subscribe (slow joiner)
    return task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def session_blocks(store: MemoryStore, session: str) -> int:
    view = await store.get_session(session)
    return view.total_blocks if view else -1


async def test_batches_apply_in_order_and_name_the_worker_by_rank(
    ctx: zmq.asyncio.Context,
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub = Publisher(ctx, endpoint)
    store = MemoryStore()
    stream = WorkerStream(PublisherSpec("pod-a", endpoint), store, ctx)
    task = await start(stream)
    try:
        await pub.send(payload([stored([1, 2, 2**64 - 1])], rank=1))
        await pub.send(payload([wire.BlockRemoved(block_hashes=[2], medium="GPU")], rank=1))

        async def applied() -> bool:
            return await session_blocks(store, "s1") == 2

        await eventually(applied)
        workers = await store.list_workers()
        assert {(w.pod, w.dp_rank) for w in workers} >= {("pod-a", 1)}
        (worker,) = [w for w in workers if w.dp_rank == 1]
        assert worker.last_seq == 1 and worker.blocks == 2
    finally:
        await stop(task)
        pub.close()


async def test_bad_frames_are_counted_and_the_stream_goes_on(ctx: zmq.asyncio.Context) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub = Publisher(ctx, endpoint)
    store = MemoryStore()
    stream = WorkerStream(PublisherSpec("pod-a", endpoint), store, ctx)
    task = await start(stream)
    try:
        await pub.sock.send_multipart([b"kv", b"\x00" * 8])
        await pub.sock.send_multipart([b"kv", b"\x00" * 3, payload([])])
        await pub.send(b"\xc1 not msgpack")
        await pub.send(payload([stored([7])]))

        async def recovered() -> bool:
            return await session_blocks(store, "s1") == 1

        await eventually(recovered)
        assert stream.stats.drops == {
            DropReason.FRAME_COUNT: 1,
            DropReason.SEQ_FRAME: 1,
            DropReason.NOT_MSGPACK: 1,
        }
    finally:
        await stop(task)
        pub.close()


async def test_topic_filter_keeps_other_topics_out(ctx: zmq.asyncio.Context) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub = Publisher(ctx, endpoint)
    store = MemoryStore()
    stream = WorkerStream(PublisherSpec("pod-a", endpoint, topic="kv@pod-a"), store, ctx)
    task = await start(stream)
    try:
        await pub.send(payload([stored([1], "other")]), topic=b"kv@pod-b@m")
        await pub.send(payload([stored([2], "mine")]), topic=b"kv@pod-a@m")

        async def mine() -> bool:
            return await session_blocks(store, "mine") == 1

        await eventually(mine)
        assert await store.get_session("other") is None
    finally:
        await stop(task)
        pub.close()


async def test_publisher_restart_on_same_port_is_detected_and_service_survives(
    ctx: zmq.asyncio.Context,
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    pub = Publisher(ctx, endpoint)
    store = MemoryStore()
    stream = WorkerStream(PublisherSpec("pod-a", endpoint), store, ctx)
    task = await start(stream)
    worker = WorkerKey("pod-a", 0)
    try:
        for i in range(5):
            await pub.send(payload([stored([100 + i], "old")]))

        async def old_applied() -> bool:
            return await session_blocks(store, "old") == 5

        await eventually(old_applied)
        pub.close()

        async def disconnected() -> bool:
            workers = {WorkerKey(w.pod, w.dp_rank): w for w in await store.list_workers()}
            return workers[worker].status.state is WorkerState.DISCONNECTED

        await eventually(disconnected)
        pub = Publisher(ctx, endpoint)  # a new engine: seq starts at 0 again, empty cache

        async def reconnected() -> bool:
            workers = {WorkerKey(w.pod, w.dp_rank): w for w in await store.list_workers()}
            return workers[worker].status.state is WorkerState.LIVE

        await eventually(reconnected)
        await asyncio.sleep(0.2)
        await pub.send(payload([stored([1], "new")]))

        async def new_applied() -> bool:
            return await session_blocks(store, "new") == 1

        await eventually(new_applied)
        assert await session_blocks(store, "old") == 0
        assert not task.done()
    finally:
        await stop(task)
        pub.close()
