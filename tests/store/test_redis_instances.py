"""The Redis store's Dynamo registrations and worker models, as laid out: one hash per
prefix, shared by replicas (within `registry_ttl`), the model a field of the worker's meta."""

from __future__ import annotations

import msgspec
import redis

from kvsi.store.model import WorkerKey, WorkerState, WorkerStatus
from kvsi.store.registry import DynamoInstance
from tests.store.conftest import MakeStore
from tests.waiting import eventually

A = WorkerKey("pod-a", 0)
ONE = DynamoInstance(7, 0, "pod-a", "llama", "default", 16, "tcp://127.0.0.1:5557")


async def test_registrations_are_one_hash_per_prefix_seen_by_every_replica(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    writer = await make_store()
    replica = await make_store(registry_ttl="0.2")
    other_fleet = await make_store(prefix=f"{prefix}-other")
    assert await replica.instances() == []  # now cached for 0.2 s

    await writer.register_instance(ONE)

    stored = raw.hgetall(f"{prefix}:dynamo")
    assert stored == {b"7/0": msgspec.msgpack.encode(ONE)}

    async def seen() -> bool:
        return await replica.instances() == [ONE]

    await eventually(seen, within=5.0)
    assert await other_fleet.instances() == []
    assert await replica.register_instance(ONE) == ONE  # taken: the replica's cache was old
    await replica.unregister_instance(7, None)
    assert raw.exists(f"{prefix}:dynamo") == 0


async def test_the_model_is_a_field_of_the_workers_meta_removed_when_unknown(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    store = await make_store()
    meta = f"{prefix}:{{pod-a/0}}:meta"

    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 1.0, model="llama"))
    assert raw.hget(meta, "model") == b"llama"

    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 2.0))
    assert raw.hexists(meta, "model") is False
    assert raw.hget(meta, "state") == b"live"
