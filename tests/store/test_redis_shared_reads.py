"""Reads of every worker that an API process caches for `registry_ttl`: the block-directory
marks a prefix match needs and the models a route restricted to a model needs. Each is read
by one request at a time: the requests in flight when it is due wait for that read (a new API
process's first prefix matches each asked every worker for its mark, and every route with a
model read every worker's model). The caches are made due by hand, not by waiting: a loaded
machine must not make one refresh two."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from kvsi.store.directory import BLOCK_DIRECTORY_MARK
from kvsi.store.model import Batch, EntriesStored, WorkerKey, WorkerState, WorkerStatus
from kvsi.store.redis import RedisStore
from kvsi.store.redis.layout import WorkerKeys
from kvsi.store.redis.plan import Arg
from tests.store.commandstats import calls
from tests.store.conftest import MakeStore

WORKERS = [WorkerKey(f"pod-{i}", 0) for i in range(20)]
CONCURRENT = 8
TTL = "3600"


def status(model: str) -> WorkerStatus:
    return WorkerStatus(state=WorkerState.LIVE, since=time.time(), model=model)


def expire_marks(reader: RedisStore) -> None:
    reader._legacy_at = -math.inf  # `registry_ttl` has passed


def expire_models(reader: RedisStore) -> None:
    reader._models.expire()


async def test_a_new_readers_concurrent_prefix_matches_ask_each_worker_for_its_mark_once(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    writer = await make_store()
    for i, worker in enumerate(WORKERS):
        await writer.apply(worker, Batch(0, 10.0, [EntriesStored([i + 1], "GPU", 0, f"s{i}")]))
    assert {raw.hget(WorkerKeys(prefix, w).meta, BLOCK_DIRECTORY_MARK) for w in WORKERS} == {b"1"}
    reader = await make_store(registry_ttl=TTL)
    hgets = calls(raw, "hget")

    found = await asyncio.gather(*(reader.match_prefix([i + 1], None) for i in range(CONCURRENT)))

    assert [set(f) for f in found] == [{WORKERS[i]} for i in range(CONCURRENT)]
    assert calls(raw, "hget") - hgets == len(WORKERS), "one mark read per worker in all"
    await reader.match_prefix([1], None)
    assert calls(raw, "hget") - hgets == len(WORKERS), "every worker marked: none asked again"


async def test_a_worker_without_its_mark_is_asked_again_once_per_refresh(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    writer = await make_store()
    await writer.apply(WORKERS[0], Batch(0, 10.0, [EntriesStored([1], "GPU", 0, "s")]))
    raw.hdel(WorkerKeys(prefix, WORKERS[0]).meta, BLOCK_DIRECTORY_MARK)
    reader = await make_store(registry_ttl=TTL)
    hgets = calls(raw, "hget")

    for _ in range(3):
        await asyncio.gather(*(reader.match_prefix([1], None) for _ in range(CONCURRENT)))
    assert calls(raw, "hget") - hgets == 1, "within one refresh: asked once"
    expire_marks(reader)
    assert (await reader.match_prefix([1], None))[WORKERS[0]] == [("GPU",)]
    assert calls(raw, "hget") - hgets == 2, "after it: asked again"


async def test_routes_restricted_to_a_model_read_the_models_once_per_refresh(
    make_store: MakeStore, raw: redis.Redis
) -> None:
    writer = await make_store()
    for worker in WORKERS:
        await writer.set_status(worker, status("m1"))
    reader = await make_store(registry_ttl=TTL)
    hgets = calls(raw, "hget")

    for _ in range(3):
        found = await asyncio.gather(*(reader.worker_models() for _ in range(CONCURRENT)))
        assert found == [dict.fromkeys(WORKERS, "m1")] * CONCURRENT
    assert calls(raw, "hget") - hgets == len(WORKERS), "one read of every worker's model"

    await writer.set_status(WORKERS[0], status("m2"))
    assert (await reader.worker_models())[WORKERS[0]] == "m1", "another process's: not yet"
    expire_models(reader)
    assert (await reader.worker_models())[WORKERS[0]] == "m2", "read again after the ttl"


async def test_a_worker_this_process_registers_has_its_model_read_at_once(
    make_store: MakeStore,
) -> None:
    store = await make_store(registry_ttl=TTL)  # writer and reader: an ingest + API process
    await store.set_status(WORKERS[0], status("m1"))
    assert await store.worker_models() == {WORKERS[0]: "m1"}

    await store.set_status(WORKERS[1], status("m2"))
    assert await store.worker_models() == {WORKERS[0]: "m1", WORKERS[1]: "m2"}

    await store.set_status(WORKERS[0], status("m3"))  # restarted on another model
    assert await store.worker_models() == {WORKERS[0]: "m3", WORKERS[1]: "m2"}


async def test_a_worker_registered_during_a_shared_read_is_read_before_the_answer(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await make_store(registry_ttl=TTL)
    await store.set_status(WORKERS[0], status("m1"))
    assert await store.worker_models() == {WORKERS[0]: "m1"}
    gate = asyncio.Event()
    scripted = store._scripted

    async def held(script: Any, calls: Sequence[tuple[list[str], list[Arg]]]) -> list[Any]:
        replies = await scripted(script, calls)  # the states log read before W1's status
        await gate.wait()
        return replies

    monkeypatch.setattr(store, "_scripted", held)
    expire_models(store)
    first = asyncio.ensure_future(store.worker_models())  # its refresh held in flight
    await asyncio.sleep(0)
    await store.set_status(WORKERS[1], status("m2"))
    second = asyncio.ensure_future(store.worker_models())  # joins that read
    await asyncio.sleep(0)
    gate.set()

    both = {WORKERS[0]: "m1", WORKERS[1]: "m2"}
    assert await first == both, "the registry moved during its read: read again"
    assert await second == both


async def test_the_models_answered_cannot_change_the_cache(make_store: MakeStore) -> None:
    store = await make_store(registry_ttl=TTL)
    await store.set_status(WORKERS[0], status("m1"))
    models = await store.worker_models()
    with pytest.raises(TypeError):
        models[WORKERS[0]] = "m2"  # type: ignore[index]
