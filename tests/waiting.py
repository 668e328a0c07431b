"""Bounded waiting for asynchronous effects in tests (no fixed sleeps, no endless loops)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    """Wait until `check()` is true; fail the test after `within` seconds."""
    deadline = time.monotonic() + within
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.02)
