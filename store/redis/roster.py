"""The central replicas' roster on Redis: one sorted set, renewed by a script on the
server's clock.

Imports neither zmq nor fastapi. Apart from the index (`RedisStore`): a process opens it
only when its central replicas split the pods, with a client of its own (a few connections).
"""

from __future__ import annotations

from typing import cast

from kvsi.store.base import RosterView
from kvsi.store.redis.layout import DEFAULT_PREFIX, roster_key
from kvsi.store.redis.reads import Client, lua
from kvsi.store.redis.store import open_client


def epoch_key(roster: str) -> str:
    """The roster's epoch, in the roster's slot: the roster key's own hash tag if it has one
    (a `{...}` in the prefix), else the whole roster key as the tag (Redis hashes the key
    `{K}:epoch` as it hashes the untagged key `K`). ValueError for a key with a `}` but no
    tag, which no other key can share a slot with by a tag."""
    start = roster.find("{")
    if start >= 0 and roster.find("}", start + 1) > start + 1:
        return f"{roster}:epoch"
    if "}" in roster:
        raise ValueError(
            f"the replicas' roster key {roster!r} has a '}}' but no hash tag: use a prefix "
            "without braces, or with a '{tag}'"
        )
    return f"{{{roster}}}:epoch"


class RedisRoster:
    """`ReplicaRoster` on Redis or Redis Cluster (the roster and its epoch: one slot)."""

    def __init__(self, client: Client, prefix: str = DEFAULT_PREFIX) -> None:
        self._client = client
        self._key = roster_key(prefix)
        self._keys = [self._key, epoch_key(self._key)]
        self._beat = client.register_script(lua("roster"))

    @classmethod
    def from_url(cls, url: str) -> RedisRoster:
        """The roster of the store at `url` (its `prefix` option names the fleet)."""
        client, options = open_client(url)
        return cls(client, options.get("prefix", DEFAULT_PREFIX))

    async def beat(self, replica: str, ttl: float, seen: int | None = None) -> RosterView:
        """roster.lua: ZADD, ZREMRANGEBYSCORE, the epoch, ZRANGE in one step."""
        ttl_ms = max(1, round(ttl * 1000))
        args: list[str | int] = [replica, ttl_ms, "" if seen is None else seen]
        reply = await self._beat(keys=self._keys, args=args)
        epoch, live = cast(tuple[int, list[bytes]], reply)
        return RosterView(int(epoch), [name.decode() for name in live])

    async def leave(self, replica: str) -> None:
        """roster.lua without a TTL: ZREM and a new epoch in one step."""
        await self._beat(keys=self._keys, args=[replica, "", ""])

    async def close(self) -> None:
        await self._client.aclose()
