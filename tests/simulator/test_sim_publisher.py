"""The publisher over real sockets: seq, drops, bounded replay, bad requests, restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.subscriber.wire import END_SEQ, AllBlocksCleared, BlockRemoved, KVEventBatch
from tests.simulator.peers import (
    nothing_within,
    recv,
    replay,
    replay_request,
    seq_of,
    subscribe,
    wait_receiving,
)

pytestmark = pytest.mark.timeout(30)

LOOPBACK = "tcp://127.0.0.1:*"


def removal(n: int) -> list[BlockRemoved]:
    return [BlockRemoved(block_hashes=[2**64 - 1 - n], medium="GPU")]


def replayed_seqs(replies: list[list[bytes]]) -> list[int]:
    return [int.from_bytes(r[2], "big") for r in replies[:-1]]


def publisher(ctx: zmq.asyncio.Context, **kwargs: Any) -> SimulatedPublisher:
    return SimulatedPublisher(LOOPBACK, replay_endpoint=LOOPBACK, context=ctx, **kwargs)


async def test_live_messages_count_seq_from_zero_with_topic_and_rank(
    ctx: zmq.asyncio.Context,
) -> None:
    async with publisher(ctx, pod="pod-b", model="m", data_parallel_rank=1) as pub:
        sub = await subscribe(ctx, pub)
        try:
            for n in range(3):
                assert await pub.publish(removal(n)) == n
                topic, seq, payload = await recv(sub)
                assert topic == b"kv@pod-b@m"
                assert seq == n.to_bytes(8, "big")
                batch = msgspec.msgpack.decode(payload, type=KVEventBatch)
                assert batch.data_parallel_rank == 1
                assert batch.events == removal(n)
        finally:
            sub.close(linger=0)
        assert pub.next_seq == 3


async def test_dropped_batches_leave_a_gap_that_replay_fills(ctx: zmq.asyncio.Context) -> None:
    async with publisher(ctx) as pub:
        sub = await subscribe(ctx, pub)
        try:
            await pub.publish(removal(0))
            pub.drop_next(2)
            for n in (1, 2, 3):
                await pub.publish(removal(n))
            received = [seq_of(await recv(sub)), seq_of(await recv(sub))]
            assert received == [0, 3]
            assert await nothing_within(sub, 0.1)
        finally:
            sub.close(linger=0)
        assert pub.replay_endpoint is not None
        replies = await replay(ctx, pub.replay_endpoint, replay_request(1))
    assert replayed_seqs(replies) == [1, 2, 3]
    assert msgspec.msgpack.decode(replies[1][3], type=KVEventBatch).events == removal(2)
    assert replies[-1] == [b"", b"", END_SEQ, b""]


async def test_replay_buffer_keeps_only_the_last_buffer_steps(ctx: zmq.asyncio.Context) -> None:
    async with publisher(ctx, buffer_steps=3) as pub:
        for n in range(5):
            await pub.publish(removal(n))
        assert pub.buffered_seqs == [2, 3, 4]
        assert pub.replay_endpoint is not None
        everything = await replay(ctx, pub.replay_endpoint, replay_request(0))
        past_end = await replay(ctx, pub.replay_endpoint, replay_request(100))
    assert replayed_seqs(everything) == [2, 3, 4]
    assert past_end == [[b"", b"", END_SEQ, b""]]


async def test_replay_requests_of_the_wrong_frame_count_are_ignored(
    ctx: zmq.asyncio.Context,
) -> None:
    async with publisher(ctx) as pub:
        await pub.publish([AllBlocksCleared()])
        assert pub.replay_endpoint is not None
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(pub.replay_endpoint)
        try:
            await dealer.send_multipart([b"", (0).to_bytes(8, "big"), b"extra"])
            await dealer.send_multipart([(0).to_bytes(8, "big")])
            assert await nothing_within(dealer, 0.3)
            await dealer.send_multipart(replay_request(0))
            assert seq_of((await recv(dealer))[1:]) == 0
            assert (await recv(dealer))[2] == END_SEQ
        finally:
            dealer.close(linger=0)
        assert pub.replay_requests_ignored == 2
        assert pub.replays_served == 1


async def test_a_new_publisher_on_the_same_endpoint_restarts_seq_at_zero(
    ctx: zmq.asyncio.Context,
) -> None:
    first = publisher(ctx)
    await first.start()
    endpoint, replay_endpoint = first.endpoint, first.replay_endpoint
    sub = await subscribe(ctx, first)
    try:
        for n in range(3):
            await first.publish(removal(n))
            await recv(sub)
        await first.close()
        with pytest.raises(RuntimeError):
            await first.publish(removal(9))
        second = SimulatedPublisher(endpoint, replay_endpoint=replay_endpoint, context=ctx)
        async with second:
            assert (second.endpoint, second.replay_endpoint) == (endpoint, replay_endpoint)
            await wait_receiving(sub, second)  # the SUB reconnects by itself
            assert await second.publish(removal(7)) == 0
            assert seq_of(await recv(sub)) == 0
            assert second.replay_endpoint is not None
            replies = await replay(ctx, second.replay_endpoint, replay_request(0))
            assert replayed_seqs(replies) == [0]
    finally:
        sub.close(linger=0)


async def test_ipc_endpoints_work_too(ctx: zmq.asyncio.Context, tmp_path: Path) -> None:
    pub = SimulatedPublisher(
        f"ipc://{tmp_path}/pub", replay_endpoint=f"ipc://{tmp_path}/replay", context=ctx
    )
    async with pub:
        assert pub.endpoint == f"ipc://{tmp_path}/pub"
        sub = await subscribe(ctx, pub)
        try:
            await pub.publish([AllBlocksCleared()])
            assert seq_of(await recv(sub)) == 0
        finally:
            sub.close(linger=0)
        replies = await replay(ctx, f"ipc://{tmp_path}/replay", replay_request(0))
    assert replayed_seqs(replies) == [0]


async def test_send_raw_bypasses_seq_and_buffer(ctx: zmq.asyncio.Context) -> None:
    async with publisher(ctx) as pub:
        sub = await subscribe(ctx, pub)
        try:
            await pub.send_raw([b"kv@x", b"\x00"])
            assert await recv(sub) == [b"kv@x", b"\x00"]
            await pub.publish_payload(b"\xc1garbage")
            assert (await recv(sub))[2] == b"\xc1garbage"
        finally:
            sub.close(linger=0)
        assert pub.next_seq == 1
        assert pub.buffered_seqs == [0]


async def test_publishing_before_start_or_after_close_fails(ctx: zmq.asyncio.Context) -> None:
    pub = publisher(ctx)
    with pytest.raises(RuntimeError, match="not started"):
        await pub.publish([])
    with pytest.raises(RuntimeError, match="not started"):
        _ = pub.endpoint
    with pytest.raises(ValueError, match="buffer_steps"):
        publisher(ctx, buffer_steps=0)
