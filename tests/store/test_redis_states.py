"""The API's cache of every worker's state on Redis: refreshed each `registry_ttl` by one GET
of the states counter while no writer changed a state, by a read of every worker otherwise,
so an idle fleet of 1,000 workers costs a reader one command a second, not 2,000."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from kvsi.store.model import WorkerKey, WorkerState, WorkerStatus
from kvsi.store.redis import RedisStore
from kvsi.store.redis import reads as reads_module
from tests.store.commandstats import calls
from tests.store.conftest import MakeStore

WORKERS = [WorkerKey(f"pod-{i}", 0) for i in range(20)]
TTL = 0.05


def status(state: WorkerState, detail: str = "") -> WorkerStatus:
    return WorkerStatus(state=state, since=time.time(), detail=detail)


async def refreshed(reader: RedisStore) -> dict[WorkerKey, WorkerState]:
    await asyncio.sleep(TTL * 2)
    return await reader.worker_states()


@pytest.fixture
async def fleet(make_store: MakeStore) -> tuple[RedisStore, RedisStore]:
    """A writer that set every worker live, and a reader whose cache holds them."""
    writer = await make_store()
    for worker in WORKERS:
        await writer.set_status(worker, status(WorkerState.LIVE))
    reader = await make_store(registry_ttl=str(TTL))
    assert set((await reader.worker_states()).values()) == {WorkerState.LIVE}
    return writer, reader


async def test_an_unchanged_fleet_costs_one_get_per_refresh(
    fleet: tuple[RedisStore, RedisStore], raw: redis.Redis
) -> None:
    _, reader = fleet
    hgets, gets = calls(raw, "hget"), calls(raw, "get")
    for _ in range(3):
        assert len(await refreshed(reader)) == len(WORKERS)
    assert calls(raw, "hget") - hgets == 0, "no worker's state read again"
    assert calls(raw, "get") - gets == 3


async def test_a_state_another_process_changed_is_read_at_the_next_refresh(
    fleet: tuple[RedisStore, RedisStore], raw: redis.Redis
) -> None:
    writer, reader = fleet
    await writer.set_status(WORKERS[3], status(WorkerState.DEGRADED, "gap"))
    assert (await refreshed(reader))[WORKERS[3]] is WorkerState.DEGRADED
    hgets = calls(raw, "hget")
    await writer.set_status(WORKERS[3], status(WorkerState.DEGRADED, "gap"))
    assert (await refreshed(reader))[WORKERS[3]] is WorkerState.DEGRADED
    assert calls(raw, "hget") == hgets, "the same state again moves no counter"


async def test_a_state_written_without_the_counter_is_read_within_the_bound(
    fleet: tuple[RedisStore, RedisStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, reader = fleet
    writer._states_key = "elsewhere"  # a writer that died before its INCR

    await writer.set_status(WORKERS[0], status(WorkerState.DISCONNECTED))
    assert (await refreshed(reader))[WORKERS[0]] is WorkerState.LIVE, "trusted for now"
    monkeypatch.setattr(reads_module, "STATES_READ_SECONDS", 0.0)
    assert (await refreshed(reader))[WORKERS[0]] is WorkerState.DISCONNECTED


async def test_the_fleet_is_listed_in_chunks_with_every_worker(
    fleet: tuple[RedisStore, RedisStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, reader = fleet
    await writer.set_status(WORKERS[7], status(WorkerState.DEGRADED, "gap"))
    monkeypatch.setattr(reads_module, "LIST_CHUNK", 3)  # 20 workers: 7 round trips

    views = await reader.list_workers()

    assert sorted((v.pod, v.status.state) for v in views) == sorted(
        (w.pod, WorkerState.DEGRADED if w == WORKERS[7] else WorkerState.LIVE) for w in WORKERS
    )
    assert (await reader.worker_states())[WORKERS[7]] == WorkerState.DEGRADED
