"""The Redis store's Dynamo registrations: one small hash, shared by every API replica.

Imports neither zmq nor fastapi. Not part of the index: names for some of its workers, so no
fence or version guards them; HSETNX makes a registration atomic (one of two racing wins).
"""

from __future__ import annotations

import functools
import time
from typing import cast

import msgspec

from kvsi.store.redis.layout import instances_key
from kvsi.store.redis.reads import Client
from kvsi.store.registry import DynamoInstance

_CODEC = msgspec.msgpack.Encoder()
_DECODE = msgspec.msgpack.Decoder(DynamoInstance)

REGISTER_ATTEMPTS = 3
"""HSETNX rounds when the registration in the way disappears between the two calls."""


def _field(instance_id: int, dp_rank: int) -> str:
    return f"{instance_id}/{dp_rank}"


class InstanceRegistry:
    """The registrations hash, with a read cache as old as the worker registry's may be."""

    def __init__(self, client: Client, key: str, ttl: float) -> None:
        self._client = client
        self._key = key
        self._ttl = ttl
        self._cached: list[DynamoInstance] | None = None
        self._cached_at = 0.0

    async def register(self, instance: DynamoInstance) -> DynamoInstance | None:
        """HSETNX, then HGET of the one in the way. O(1)."""
        field = _field(instance.instance_id, instance.dp_rank)
        self._cached = None
        for _ in range(REGISTER_ATTEMPTS):
            if await self._client.hsetnx(self._key, field, _CODEC.encode(instance)):
                return None
            raw = cast(bytes | None, await self._client.hget(self._key, field))
            if raw is not None:
                return _DECODE.decode(raw)
        raise RuntimeError(f"Dynamo instance {field}: registered and removed on every attempt")

    async def read(self) -> list[DynamoInstance]:
        """HGETALL, reused for the cache's age. O(registrations)."""
        now = time.monotonic()
        if self._cached is None or now - self._cached_at >= self._ttl:
            raw = cast(dict[bytes, bytes], await self._client.hgetall(self._key))
            found = [_DECODE.decode(value) for value in raw.values()]
            self._cached = sorted(found, key=lambda i: (i.instance_id, i.dp_rank))
            self._cached_at = now
        return self._cached

    async def unregister(self, instance_id: int, dp_rank: int | None) -> list[DynamoInstance]:
        """HGETALL, then HDEL of the matching fields. O(registrations)."""
        self._cached = None
        raw = cast(dict[bytes, bytes], await self._client.hgetall(self._key))
        gone = [
            found
            for found in map(_DECODE.decode, raw.values())
            if found.instance_id == instance_id and dp_rank in (None, found.dp_rank)
        ]
        if gone:
            await self._client.hdel(self._key, *(_field(i.instance_id, i.dp_rank) for i in gone))
        return sorted(gone, key=lambda i: i.dp_rank)


class RedisInstances:
    """The Dynamo registration methods of the IndexStore contract, mixed into RedisStore."""

    _client: Client
    _prefix: str
    _registry_ttl: float

    @functools.cached_property
    def _dynamo(self) -> InstanceRegistry:
        return InstanceRegistry(self._client, instances_key(self._prefix), self._registry_ttl)

    async def register_instance(self, instance: DynamoInstance) -> DynamoInstance | None:
        return await self._dynamo.register(instance)

    async def instances(self) -> list[DynamoInstance]:
        return await self._dynamo.read()

    async def unregister_instance(
        self, instance_id: int, dp_rank: int | None
    ) -> list[DynamoInstance]:
        return await self._dynamo.unregister(instance_id, dp_rank)
