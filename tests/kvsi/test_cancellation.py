"""A SIGTERM cancels the service's main task (kvsi/cli.py): no await on the way may swallow
that cancellation. Python 3.11's `asyncio.wait_for` did, when the cancellation came in the
loop turn its operation completed (CPython gh-86296): the service then ran on after SIGTERM,
or its shutdown waited forever on a task that never stopped. Each test cancels in every
loop turn around the operation's completion."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from kvsi.serve import warn_if_unreachable
from kvsi.simulator.fleet import SimulatedFleet
from kvsi.store.memory import MemoryStore

TURNS = range(6)


async def outcome(work: Callable[[], Awaitable[None]], turns: int, then: Callable[[], None]) -> str:
    """Run `work` as a task, call `then` at once, cancel the task `turns` loop turns later."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(work())

    def cancel_after(left: int) -> None:
        if left:
            loop.call_soon(cancel_after, left - 1)
        else:
            task.cancel()

    then()
    loop.call_soon(cancel_after, turns)
    try:
        await task
    except asyncio.CancelledError:
        return "cancelled"
    return "ran on"


@pytest.mark.parametrize("turns", TURNS)
async def test_the_start_up_store_check_keeps_a_cancellation(turns: int) -> None:
    async def starting() -> None:
        await warn_if_unreachable(MemoryStore(), "memory://")  # answers at once
        await asyncio.sleep(5)  # the rest of the start-up

    assert await outcome(starting, turns, lambda: None) == "cancelled"


@pytest.mark.parametrize("turns", TURNS)
async def test_the_demo_fleets_pause_keeps_a_cancellation(turns: int) -> None:
    fleet = SimulatedFleet(pods=1)

    async def ticking() -> None:
        await fleet._sleep_or_stop(5)  # ends as the stop is set
        await asyncio.sleep(5)  # the next tick

    assert await outcome(ticking, turns, fleet.stop) == "cancelled"
