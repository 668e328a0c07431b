"""A Redis Cluster client whose callers wait for a connection instead of failing.

Imports neither zmq nor fastapi. Why (bench/README.md, fleet_latency.py): redis-py's cluster
client opens at most `max_connections` per node and raises `MaxConnectionsError` past them
(`ClusterNode.acquire_connection` does not wait), where the standalone client here waits
for one of its pool. One process following 1,000 workers has more calls than that in
flight as its streams start; each failed call was retried by its stream after a backoff,
and the warm-up churned.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterPipeline
from redis.exceptions import ConnectionError

SPARE = 8
"""Connections of a node's pool beyond the calls in flight: what redis-py takes for itself
within a call (a command sent again one by one after a redirection, the slot map read again
after an error, a command's policy lookup)."""

_HOLDING: contextvars.ContextVar[bool] = contextvars.ContextVar("kvsi_cluster_call", default=False)
"""Whether the running task (or the task that started it) is inside a call that holds a
place: redis-py's own commands within it do not queue behind it."""


class WaitingCluster(RedisCluster):
    """`RedisCluster` with at most `calls` commands and pipelines in flight at once.

    A call holds at most one connection of each node at a time, so with `calls + SPARE`
    connections per node no node's pool runs out; a caller beyond `calls` waits for a
    place, up to `wait` seconds, and then fails with ConnectionError (as the standalone
    `BlockingConnectionPool` does). Calls made by redis-py inside a call that holds a place
    run without another (they would otherwise wait behind their own caller).
    """

    def __init__(self, *, calls: int, wait: float, **kwargs: Any) -> None:
        super().__init__(max_connections=calls + SPARE, **kwargs)
        self.calls = calls
        self._wait = wait
        self._places = asyncio.Semaphore(calls)

    @contextlib.asynccontextmanager
    async def place(self) -> AsyncIterator[None]:
        """Hold one of the `calls` places while inside (at once if already holding one)."""
        if _HOLDING.get():
            yield
            return
        try:
            async with asyncio.timeout(self._wait):
                await self._places.acquire()
        except TimeoutError:
            raise ConnectionError(
                f"no cluster connection free within {self._wait:g} s ({self.calls} calls in flight)"
            ) from None
        token = _HOLDING.set(True)
        try:
            yield
        finally:
            _HOLDING.reset(token)
            self._places.release()

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self.place():
            return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # raises as redis-py's does
        return _WaitingPipeline(self, transaction)  # type: ignore[abstract]  # set in __init__


class _WaitingPipeline(ClusterPipeline):
    """A `WaitingCluster`'s pipeline: its execution holds one place."""

    def __init__(self, client: WaitingCluster, transaction: Any | None) -> None:
        super().__init__(client, transaction)
        self._client = client

    async def execute(
        self, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> list[Any]:
        async with self._client.place():
            return await super().execute(raise_on_error, allow_redirections)
