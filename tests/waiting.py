"""Bounded waiting for asynchronous effects in tests (no fixed sleeps, no endless loops).

One rule in two forms: poll `check` until it returns something truthy (returned), reading
the exceptions in `tolerate` as "not yet"; fail with what was awaited, the last answer and
`context()` (a service's log, say) after `within` seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

NOTHING: tuple[type[BaseException], ...] = ()


def _expired(what: str, within: float, last: object, context: Callable[[], str]) -> AssertionError:
    shown = context()
    return AssertionError(
        f"{what}: not within {within}s (last: {last!r})" + (f"\n{shown}" if shown else "")
    )


async def until(
    check: Callable[[], Awaitable[T | None]],
    within: float = 10.0,
    what: str = "condition",
    *,
    tolerate: tuple[type[BaseException], ...] = NOTHING,
    context: Callable[[], str] = str,
    every: float = 0.02,
) -> T:
    """The first truthy value of `await check()`; AssertionError after `within` seconds."""
    deadline = time.monotonic() + within
    last: object = None
    while True:
        try:
            last = await check()
            if last:
                return last  # type: ignore[return-value]
        except tolerate as exc:
            last = exc
        if time.monotonic() > deadline:
            raise _expired(what, within, last, context)
        await asyncio.sleep(every)


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    """Wait until `check()` is true; fail the test after `within` seconds."""
    await until(check, within)


def until_sync(
    check: Callable[[], T | None],
    within: float = 10.0,
    what: str = "condition",
    *,
    tolerate: tuple[type[BaseException], ...] = NOTHING,
    context: Callable[[], str] = str,
    every: float = 0.05,
) -> T:
    """`until` for code without an event loop (fixtures that start servers)."""
    deadline = time.monotonic() + within
    last: object = None
    while True:
        try:
            last = check()
            if last:
                return last  # type: ignore[return-value]
        except tolerate as exc:
            last = exc
        if time.monotonic() > deadline:
            raise _expired(what, within, last, context)
        time.sleep(every)
