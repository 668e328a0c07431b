"""The central replicas' roster on Redis: one sorted set, renewed by a script on the
server's clock.

Imports neither zmq nor fastapi. Apart from the index (`RedisStore`): a process opens it
only when its central replicas split the pods, with a client of its own (a few connections).
"""

from __future__ import annotations

from typing import cast

from kvsi.store.redis.layout import DEFAULT_PREFIX, roster_key
from kvsi.store.redis.reads import Client, lua
from kvsi.store.redis.store import open_client


class RedisRoster:
    """`ReplicaRoster` on Redis or Redis Cluster (one key: one slot)."""

    def __init__(self, client: Client, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self._key = roster_key(prefix)
        self._beat = client.register_script(lua("roster"))

    @classmethod
    def from_url(cls, url: str) -> RedisRoster:
        """The roster of the store at `url` (its `prefix` option names the fleet)."""
        client, options = open_client(url)
        return cls(client, options.get("prefix", DEFAULT_PREFIX))

    async def beat(self, replica: str, ttl: float) -> list[str]:
        """roster.lua: ZADD, ZREMRANGEBYSCORE, ZRANGE in one step."""
        live = await self._beat(keys=[self._key], args=[replica, max(1, round(ttl * 1000))])
        return [name.decode() for name in cast(list[bytes], live)]

    async def leave(self, replica: str) -> None:
        await self._client.zrem(self._key, replica)

    async def close(self) -> None:
        await self._client.aclose()
