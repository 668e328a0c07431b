"""Waits for a connection, counted: `WaitTally`, and the standalone client's pool that keeps
one (`CountingPool`; the cluster client's places keep another, cluster_client.py).

Imports neither zmq nor fastapi, nor prometheus_client: the wiring reads the counts
(`RedisStore.connection_waits`) and exports them.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import AbstractConnection

from kvsi.store.base import ConnectionWaits

T = TypeVar("T")


class WaitTally:
    """The calls that waited for a connection (or a place) and their seconds, summed. No I/O."""

    __slots__ = ("_seconds", "_waits")

    def __init__(self) -> None:
        self._waits = 0
        self._seconds = 0.0

    async def timed(self, wait: Awaitable[T]) -> T:
        """`wait`'s result, counted as one wait with its seconds (also when it timed out or
        was cancelled: it waited)."""
        started = time.monotonic()
        try:
            return await wait
        finally:
            self._waits += 1
            self._seconds += time.monotonic() - started

    def read(self) -> ConnectionWaits:
        return ConnectionWaits(self._waits, self._seconds)


class CountingPool(BlockingConnectionPool):
    """`BlockingConnectionPool`, counting the callers of `get_connection` that found no
    connection free (every one of `max_connections` in use) and waited for one, and the
    seconds they waited.

    redis-py's `get_connection` waits on a condition until `can_get_connection` holds (a
    connection was given back) or `timeout` passes (then ConnectionError); this checks the
    same condition first (and that its lock is free: a release holds it while it closes a
    connection) and times the calls that will wait, and changes nothing else. A
    waiter's seconds run to the connection in hand: a connection given back closed (after
    an error) is connected again inside them. A caller that finds one free costs one check
    more, and is not counted.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waited = WaitTally()

    def get_connection(self, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, AbstractConnection]:
        """redis-py's `get_connection`, timed when no connection is free. Not a coroutine
        itself: a caller that finds one free awaits redis-py's own, with no frame more."""
        call: Coroutine[Any, Any, AbstractConnection] = super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        if self.can_get_connection() and not self._condition.locked():
            return call
        return self.waited.timed(call)
