"""How the Redis store's commands reach Redis: hiredis packing, and a direct path for apply.

Imports neither zmq nor fastapi. Why, measured on the 2-core bench VM with one batch's
EVALSHA (~300 arguments): redis-py's asyncio `pack_command` is Python that re-joins its
buffer for every argument, ~150 µs; hiredis (already installed to parse replies) packs it in
C in ~25 µs. redis-py's command layer (pool checkout, retry wrapper, response callbacks,
observability hooks) then costs tens of µs more per call than writing the packed bytes on a
pooled connection, which is what `DirectScript` does for a standalone server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, cast

import hiredis
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

C = TypeVar("C", bound=AbstractConnection)

_PACKING: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def packing(base: type[C]) -> type[C]:
    """`base` (plain, TLS or unix-socket connection) with hiredis packing; one per base.

    The store's client only sends str, bytes, int and float arguments, which both packers
    render alike (floats by repr); anything else falls back to redis-py's packer and errors.
    """
    if base in _PACKING.values():
        return base
    if base in _PACKING:
        return cast(type[C], _PACKING[base])

    class HiredisPacking(base):  # type: ignore[valid-type,misc]
        def pack_command(self, *args: Any) -> list[bytes]:
            if isinstance(args[0], str) and " " in args[0]:
                args = (*args[0].split(), *args[1:])  # "SCRIPT LOAD" is two words
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                return list(super().pack_command(*args))

    HiredisPacking.__name__ = HiredisPacking.__qualname__ = f"HiredisPacking{base.__name__}"
    _PACKING[base] = HiredisPacking
    return HiredisPacking


def use_hiredis_packing(client: Redis | RedisCluster) -> None:
    """Make the (not yet connected) client's connections pack with hiredis.

    Standalone: the pool's `connection_class`. Cluster: the connection kwargs every node is
    built from, and the startup nodes already built from them.
    """
    if isinstance(client, RedisCluster):
        kwargs = client.connection_kwargs
        kwargs["connection_class"] = packing(kwargs["connection_class"])
        for node in client.startup_nodes:
            node.connection_class = packing(node.connection_class)
    else:
        pool = client.connection_pool
        pool.connection_class = packing(pool.connection_class)


class DirectScript:
    """EVALSHA of `script` on a standalone server, packed by hiredis, on its own connections.

    Does what redis-py's AsyncScript does (load the script again after NOSCRIPT) without the
    command layer, and keeps its connections (one per concurrent call, so one per worker
    writing at once; made by the client's pool, with its options) rather than checking one
    out of the pool per call: measured ~7% of ingest. The connection handles errors: on
    any failure while sending or reading it disconnects, so a half-read reply is never read
    as the next call's, and it reconnects on its next use. A cluster keeps AsyncScript: it
    needs redis-py's slot routing and redirections.
    """

    def __init__(self, client: Redis, script: AsyncScript) -> None:
        self._client = client
        self._script = script
        self._idle: list[AbstractConnection] = []

    async def __call__(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        try:
            return await self._once(keys, args)
        except NoScriptError:
            self._script.sha = await self._client.script_load(self._script.script)
            return await self._once(keys, args)

    async def _once(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        packed = hiredis.pack_command(("EVALSHA", self._script.sha, len(keys), *keys, *args))
        idle = self._idle
        pool = self._client.connection_pool
        conn = idle.pop() if idle else pool.make_connection()  # type: ignore[no-untyped-call]
        try:
            await conn.send_packed_command(packed)
            return await conn.read_response()
        finally:
            idle.append(conn)

    async def aclose(self) -> None:
        for conn in self._idle:
            await conn.disconnect()
        self._idle.clear()
