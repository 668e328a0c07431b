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
import contextvars
from collections import deque
from collections.abc import Coroutine
from typing import Any, TypeVar

from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterPipeline
from redis.exceptions import ConnectionError

from kvsi.store.redis.pool import WaitTally

T = TypeVar("T")

SPARE = 8
"""Connections of a node's pool beyond the calls in flight: a margin for connections that
outlive their call's place for a moment (redis-py closes a connection marked for reconnect
after a slot map refresh in a task of its own, after it was given back; a multi-node call
that raised leaves its other nodes' requests to finish)."""

_HOLDING: contextvars.ContextVar[WaitingCluster | None] = contextvars.ContextVar(
    "kvsi_cluster_call", default=None
)
"""The client whose place the running task (or the task that started it) holds: redis-py's
own commands within that call (a pipeline's commands sent again after a redirection) do not
queue behind it."""


class Places:
    """At most `size` holders at once; takers past them wait in line, first come first
    served. No I/O. A free place is taken without awaiting anything (the request path
    takes one per round)."""

    __slots__ = ("_free", "_line")

    def __init__(self, size: int) -> None:
        self._free = size
        self._line: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        """Take a free place if there is one (then no one waits: a place given back goes to
        the first in line)."""
        if self._free:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        """A free place, or wait in line for one (cancellable: a place handed over
        meanwhile is given back)."""
        if self.take_now():
            return
        turn = asyncio.get_running_loop().create_future()
        self._line.append(turn)
        try:
            await turn
        except BaseException:  # cancelled, or the coroutine closed
            if turn.done() and not turn.cancelled():
                self.give_back()
            elif turn in self._line:
                self._line.remove(turn)
            raise

    def give_back(self) -> None:
        """Hand the place to the first in line still waiting, or free it."""
        line = self._line
        while line:
            turn = line.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        self._free += 1


class WaitingCluster(RedisCluster):
    """`RedisCluster` with at most `calls` commands and pipelines in flight at once.

    A call holds at most one connection of each node at a time, and each node's pool has
    `calls + SPARE` (`calls` replaces redis-py's `max_connections`, which is not passed
    too); a caller beyond `calls` waits for a place, up to `wait` seconds, and then fails
    with ConnectionError (as the standalone `BlockingConnectionPool` does). Calls made by
    redis-py inside a call that holds a place run without another (they would otherwise
    wait behind their own caller). The callers that waited for a place, and their seconds,
    are counted (`waited`); one that took a place at once costs nothing more.
    """

    def __init__(self, *, calls: int, wait: float, **kwargs: Any) -> None:
        super().__init__(max_connections=calls + SPARE, **kwargs)
        self.calls = calls
        self._wait = wait
        self._places = Places(calls)
        self.waited = WaitTally()

    async def take_place(self) -> None:
        """Take a place, for a caller that gives it back itself (`give_place`) and makes
        no call of this client meanwhile."""
        if not self._places.take_now():
            await self._wait_for_place()

    def give_place(self) -> None:
        """Give back a place `take_place` took."""
        self._places.give_back()

    async def held(self, call: Coroutine[Any, Any, T]) -> T:
        """`call`'s result, run holding a place (its own, or the caller's); closed unrun if
        no place came."""
        if _HOLDING.get() is self:
            return await call
        try:
            await self.take_place()
        except BaseException:
            call.close()
            raise
        token = _HOLDING.set(self)
        try:
            return await call
        finally:
            _HOLDING.reset(token)
            self._places.give_back()

    async def _wait_for_place(self) -> None:
        try:
            async with asyncio.timeout(self._wait):
                await self.waited.timed(self._places.take())
        except TimeoutError:
            raise ConnectionError(
                f"no cluster connection free within {self._wait:g} s ({self.calls} calls in flight)"
            ) from None

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        return await self.held(super().execute_command(*args, **kwargs))

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # raises as redis-py's does
        # redis-py's stubs declare `_event_dispatcher` abstract; ClusterPipeline sets it.
        return _WaitingPipeline(self, transaction)  # type: ignore[abstract]


class _WaitingPipeline(ClusterPipeline):
    """A `WaitingCluster`'s pipeline: its execution holds one place."""

    cluster_client: WaitingCluster

    async def execute(
        self, raise_on_error: bool = True, allow_redirections: bool = True
    ) -> list[Any]:
        held = self.cluster_client.held
        return await held(super().execute(raise_on_error, allow_redirections))
