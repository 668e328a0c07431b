"""The receiver: a SUB drained into the inbox in bursts, over real ZMQ sockets (inproc)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

import pytest
import zmq
import zmq.asyncio

from kvsi.subscriber.inbox import Inbox
from kvsi.subscriber.receiver import DRAIN_MAX, Receiver
from kvsi.subscriber.sockets import waiting_message
from tests.waiting import eventually


def msg(seq: int, topic: bytes = b"kv@pod-a@m") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), b"payload"]


class Pair:
    """An XPUB and a SUB subscribed to it (the subscription seen by the XPUB: connected)."""

    def __init__(self, ctx: zmq.asyncio.Context, name: str) -> None:
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.pub.bind(f"inproc://{name}")
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.RCVHWM, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(f"inproc://{name}")

    async def connected(self) -> None:
        assert await asyncio.wait_for(self.pub.recv(), 5) == b"\x01"

    async def send(self, messages: list[list[bytes]]) -> None:
        for frames in messages:
            await self.pub.send_multipart(frames)

    def settle(self) -> None:
        """Have the SUB process its pending commands: its FD stops signalling, while the
        messages sent so far still wait in it (what a wake-up that read only some of them,
        or a socket read before the reader was added, leaves behind)."""
        self.sub.getsockopt(zmq.EVENTS)

    def close(self) -> None:
        self.sub.close(linger=0)
        self.pub.close(linger=0)


@pytest.fixture
async def pair(ctx: zmq.asyncio.Context, request: pytest.FixtureRequest) -> AsyncIterator[Pair]:
    made = Pair(ctx, request.node.name)
    await made.connected()
    try:
        yield made
    finally:
        made.close()


class Running:
    """A receiver's task over an inbox, with what it reported."""

    def __init__(self, pair: Pair, capacity: int) -> None:
        self.inbox = Inbox(capacity)
        self.topics: list[bytes] = []
        self.overflows = 0
        self.receiver = Receiver(
            pair.sub, self.inbox, on_topic=self.topics.append, on_overflow=self._overflowed
        )
        self.task = asyncio.create_task(self.receiver.run())

    def _overflowed(self) -> None:
        self.overflows += 1

    async def held(self, count: int) -> list[int]:
        async def arrived() -> bool:
            return len(self.inbox) >= count

        await eventually(arrived, within=5)
        return [int.from_bytes(frames[1], "big") for frames in self.inbox.take(len(self.inbox))]

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def test_messages_waiting_before_the_receiver_starts_are_read_without_a_signal(
    pair: Pair,
) -> None:
    await pair.send([msg(seq) for seq in range(5)])
    pair.settle()
    running = Running(pair, capacity=100)
    try:
        assert await running.held(5) == [0, 1, 2, 3, 4]
    finally:
        await running.stop()


async def test_a_backlog_beyond_one_wake_up_is_read_in_full_and_in_order(pair: Pair) -> None:
    backlog = 2 * DRAIN_MAX + 7
    await pair.send([msg(seq) for seq in range(backlog)])
    pair.settle()
    running = Running(pair, capacity=10 * DRAIN_MAX)
    try:
        assert await running.held(backlog) == list(range(backlog))
        await pair.send([msg(backlog)])
        assert await running.held(1) == [backlog], "still reading after the backlog"
    finally:
        await running.stop()


async def test_a_full_inbox_drops_the_newest_of_a_burst_and_reports_it(pair: Pair) -> None:
    await pair.send([msg(seq) for seq in range(10)])
    pair.settle()
    running = Running(pair, capacity=4)
    try:
        assert await running.held(4) == [0, 1, 2, 3]
        assert running.inbox.overflowed == 6 and running.overflows >= 1
        assert running.inbox.last_dropped == msg(9)
    finally:
        await running.stop()


async def test_a_new_topic_is_reported_once_where_it_changes(pair: Pair) -> None:
    a, b = b"kv@pod-a@m1", b"kv@pod-a@m2"
    running = Running(pair, capacity=100)
    try:
        await pair.send([msg(0, a), msg(1, a), msg(2, b), msg(3, b), msg(4, a)])
        assert await running.held(5) == [0, 1, 2, 3, 4]
        assert running.topics == [a, b, a]
    finally:
        await running.stop()


async def test_waiting_message_reads_every_frame_and_none_when_nothing_waits(pair: Pair) -> None:
    plain: zmq.Socket[bytes] = zmq.Socket.shadow(pair.sub.underlying)
    assert waiting_message(plain) is None
    sent = [msg(1), [b"one frame"], [b"a", b"", b"c", b"d" * 70_000]]
    await pair.send(sent)

    async def all_here() -> bool:
        return bool(cast(int, plain.get(zmq.EVENTS)) & zmq.POLLIN)

    await eventually(all_here)
    got = []
    while (frames := waiting_message(plain)) is not None:
        got.append(frames)
    assert got == sent
    assert waiting_message(plain) is None
