"""The standalone client's connection pool: redis-py's blocking pool, counting its waits.

Imports neither zmq nor fastapi, nor prometheus_client: the wiring reads the counts
(`RedisStore.connection_waits`) and exports them.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import Any

from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import AbstractConnection

from kvsi.store.base import ConnectionWaits


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
        self._waits = 0
        self._wait_seconds = 0.0

    def get_connection(self, *args: Any, **kwargs: Any) -> Coroutine[Any, Any, AbstractConnection]:
        """redis-py's `get_connection`, timed when no connection is free. Not a coroutine
        itself: a caller that finds one free awaits redis-py's own, with no frame more."""
        call: Coroutine[Any, Any, AbstractConnection] = super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        if self.can_get_connection() and not self._condition.locked():
            return call
        return self._timed(call)

    async def _timed(self, call: Coroutine[Any, Any, AbstractConnection]) -> AbstractConnection:
        started = time.monotonic()
        try:
            return await call
        finally:  # a wait that timed out or was cancelled counts too: it waited
            self._waits += 1
            self._wait_seconds += time.monotonic() - started

    def connection_waits(self) -> ConnectionWaits:
        """The callers that waited so far and their seconds; no I/O."""
        return ConnectionWaits(self._waits, self._wait_seconds)
