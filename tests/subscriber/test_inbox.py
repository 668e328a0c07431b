"""The receiver-to-applier inbox: bounded, drops the newest, remembers the last dropped."""

from __future__ import annotations

import asyncio
import time

import pytest

from kvsi.subscriber.inbox import Inbox


def msg(seq: int) -> list[bytes]:
    return [b"t", seq.to_bytes(8, "big"), b"p"]


async def test_a_full_inbox_drops_the_newest_and_keeps_the_held_ones_in_order() -> None:
    inbox = Inbox(3)
    dropped = [inbox.put([msg(seq)], time.monotonic()) for seq in range(5)]
    assert dropped == [False, False, False, True, True]
    assert inbox.overflowed == 2
    assert inbox.last_dropped == msg(4)
    assert inbox.newest == msg(4)
    got = []
    while len(inbox):
        item = await inbox.get()
        assert item is not None
        got.append(item[1])
    assert got == [msg(0), msg(1), msg(2)]
    dropped_at, frames = inbox.take_dropped()
    assert frames == msg(4) and dropped_at > 0
    assert inbox.last_dropped is None


async def test_get_waits_for_a_message_and_wake_returns_none() -> None:
    inbox = Inbox(2)
    waiter = asyncio.create_task(inbox.get())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    inbox.wake()
    assert await asyncio.wait_for(waiter, 1) is None
    waiter = asyncio.create_task(inbox.get())
    await asyncio.sleep(0.01)
    inbox.put([msg(9)], time.monotonic())
    item = await asyncio.wait_for(waiter, 1)
    assert item is not None and item[1] == msg(9)


async def test_oldest_arrival_is_the_head_of_the_queue() -> None:
    inbox = Inbox(4)
    assert inbox.oldest_arrival() is None
    inbox.put([msg(0)], time.monotonic())
    first = inbox.oldest_arrival()
    await asyncio.sleep(0.01)
    inbox.put([msg(1)], time.monotonic())
    assert inbox.oldest_arrival() == first
    await inbox.get()
    second = inbox.oldest_arrival()
    assert first is not None and second is not None and second > first


async def test_a_burst_is_held_in_order_up_to_the_room_left_and_the_rest_dropped() -> None:
    inbox = Inbox(5)
    assert not inbox.put([msg(0), msg(1)], 1.0)
    assert inbox.put([msg(seq) for seq in range(2, 7)], 2.0)
    assert inbox.overflowed == 2
    assert inbox.last_dropped == msg(6) and inbox.newest == msg(6)
    assert inbox.put([msg(7)], 3.0), "a full inbox drops a whole burst"
    assert inbox.overflowed == 3 and inbox.last_dropped == msg(7)
    held = [await inbox.get() for _ in range(len(inbox))]
    assert held == [(1.0, msg(0)), (1.0, msg(1)), (2.0, msg(2)), (2.0, msg(3)), (2.0, msg(4))]
    assert inbox.take_dropped() == (2.0, msg(7)), "the hole's age is its first drop's"


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Inbox(0)
