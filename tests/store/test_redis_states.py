"""The API's cache of every worker's state on Redis: refreshed each `registry_ttl` by one call
that answers the states counter and, if it moved, which workers it moved for (the states
log), whose states alone are read again; every worker's only when the log misses a move.
An idle fleet of 1,000 workers costs a reader one command a second, a changed state two
more, not 2,000."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest
import redis

from kvsi.store.model import Batch, EntriesStored, WorkerKey, WorkerState, WorkerStatus
from kvsi.store.redis import RedisStore
from kvsi.store.redis import reads as reads_module
from kvsi.store.redis.layout import states_key, states_log_key
from kvsi.store.redis.node_reads import Command
from tests.redis_servers import RedisClusterServers
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


async def test_an_unchanged_fleet_costs_one_call_per_refresh(
    fleet: tuple[RedisStore, RedisStore], raw: redis.Redis
) -> None:
    _, reader = fleet
    await refreshed(reader)  # the reader's first call loads its script
    hgets, scripts = calls(raw, "hget"), calls(raw, "evalsha")
    for _ in range(3):
        assert len(await refreshed(reader)) == len(WORKERS)
    assert calls(raw, "hget") - hgets == 0, "no worker's state read again"
    assert calls(raw, "evalsha") - scripts == 3


async def test_a_changed_state_reads_that_worker_again_not_every_worker(
    fleet: tuple[RedisStore, RedisStore], raw: redis.Redis
) -> None:
    writer, reader = fleet
    before = await reader.worker_states()
    hgets = calls(raw, "hget")
    await writer.set_status(WORKERS[3], status(WorkerState.DEGRADED, "gap"))
    await writer.set_status(WORKERS[5], status(WorkerState.DEGRADED, "gap"))
    await writer.set_status(WORKERS[3], status(WorkerState.LIVE))

    after = await refreshed(reader)

    assert calls(raw, "hget") - hgets == 2, "the two workers the log names"
    assert after == {**before, WORKERS[5]: WorkerState.DEGRADED}
    assert await refreshed(reader) is after, "unchanged since: the same mapping"


async def test_a_model_another_process_changed_is_read_from_the_log(
    fleet: tuple[RedisStore, RedisStore], raw: redis.Redis
) -> None:
    """A status of the same state on another model (a pod restarted quickly) is logged too."""
    writer, reader = fleet
    assert set((await reader.worker_models()).values()) == {None}
    hgets = calls(raw, "hget")
    await writer.set_status(WORKERS[6], WorkerStatus(state=WorkerState.LIVE, model="m2"))

    await asyncio.sleep(TTL * 2)
    models = await reader.worker_models()

    assert calls(raw, "hget") - hgets == 1, "the worker the log names"
    assert models == {**dict.fromkeys(WORKERS), WORKERS[6]: "m2"}


async def test_a_worker_registered_since_is_read_alone(
    fleet: tuple[RedisStore, RedisStore], raw: redis.Redis
) -> None:
    writer, reader = fleet
    new = WorkerKey("pod-new", 0)
    await writer.set_status(new, status(WorkerState.CONNECTING))  # a new worker's: not logged
    hgets = calls(raw, "hget")

    states = await refreshed(reader)

    assert calls(raw, "hget") - hgets == 1
    assert states == {**dict.fromkeys(WORKERS, WorkerState.LIVE), new: WorkerState.CONNECTING}


def _older_writer(raw: redis.Redis, prefix: str) -> None:
    raw.incr(states_key(prefix))  # a writer of an earlier kvsi: its INCR, no log entry


def _log_trimmed(raw: redis.Redis, prefix: str) -> None:
    raw.delete(states_log_key(prefix))


def _counter_went_back(raw: redis.Redis, prefix: str) -> None:
    """A failover lost the newest moves of the counter and their entries; the writes after it
    take the counter past where the reader was."""
    raw.decrby(states_key(prefix), 3)
    for entry, _ in raw.xrevrange(states_log_key(prefix), count=3):
        raw.xdel(states_log_key(prefix), entry)


@pytest.mark.parametrize("miss", [_older_writer, _log_trimmed, _counter_went_back])
async def test_a_move_the_log_misses_reads_every_worker_again(
    fleet: tuple[RedisStore, RedisStore],
    raw: redis.Redis,
    prefix: str,
    miss: Callable[[redis.Redis, str], None],
) -> None:
    writer, reader = fleet
    await writer.set_status(WORKERS[3], status(WorkerState.DEGRADED, "gap"))
    miss(raw, prefix)
    for worker in WORKERS[4:8]:  # past the count the reader knows, whatever `miss` took
        await writer.set_status(worker, status(WorkerState.DEGRADED, "gap"))
    hgets = calls(raw, "hget")

    states = await refreshed(reader)

    assert calls(raw, "hget") - hgets == len(WORKERS)
    assert {w for w, s in states.items() if s is WorkerState.DEGRADED} == set(WORKERS[3:8])


async def test_a_reader_far_behind_reads_every_worker_again(
    fleet: tuple[RedisStore, RedisStore], raw: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, reader = fleet
    monkeypatch.setattr(reads_module, "STATES_LOG_READ", 2)
    for worker in WORKERS[:3]:
        await writer.set_status(worker, status(WorkerState.DISCONNECTED))
    hgets = calls(raw, "hget")

    states = await refreshed(reader)

    assert calls(raw, "hget") - hgets == len(WORKERS)
    assert {w for w, s in states.items() if s is WorkerState.DISCONNECTED} == set(WORKERS[:3])


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

    async def died(**_: object) -> None:  # a writer that died before states_log.lua
        return None

    monkeypatch.setattr(writer, "_states_log_script", died)

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


@pytest.mark.cluster
async def test_on_a_cluster_a_changed_state_is_read_from_the_log(
    make_store: MakeStore, redis_cluster: RedisClusterServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counter and the log share a slot: one call answers both on a cluster too."""
    writer = await make_store(redis_cluster.url)
    for worker in WORKERS:
        await writer.set_status(worker, status(WorkerState.LIVE))
    reader = await make_store(redis_cluster.url, registry_ttl=str(TTL))
    assert set((await reader.worker_states()).values()) == {WorkerState.LIVE}
    await writer.set_status(WORKERS[2], status(WorkerState.DEGRADED, "gap"))
    read_every_worker: list[int] = []

    async def counted() -> None:
        read_every_worker.append(1)

    monkeypatch.setattr(reader, "_read_field", counted)

    states = await refreshed(reader)

    assert read_every_worker == []
    assert {w for w, s in states.items() if s is not WorkerState.LIVE} == {WORKERS[2]}


async def _slow_reader(make_store: MakeStore) -> RedisStore:
    """A reader whose registry stays as read for the test (its states expired by hand)."""
    reader = await make_store(registry_ttl="3600")
    await reader.worker_states()
    return reader


async def test_a_worker_logged_then_removed_costs_no_read_per_request(
    fleet: tuple[RedisStore, RedisStore], raw: redis.Redis, make_store: MakeStore
) -> None:
    writer, _ = fleet
    reader = await _slow_reader(make_store)
    await writer.set_status(WORKERS[0], status(WorkerState.DISCONNECTED))
    await writer.remove_worker(WORKERS[0])
    reader._states.expire()  # the states due, the reader's registry not
    hgets = calls(raw, "hget")

    answers = [await reader.worker_states() for _ in range(10)]

    assert calls(raw, "hget") - hgets == 1, "the logged worker, found gone once"
    assert set(answers[0]) == set(WORKERS[1:])
    assert all(a is answers[0] for a in answers)


async def test_a_worker_removed_and_created_again_within_the_ttl_shows_its_new_state(
    fleet: tuple[RedisStore, RedisStore], make_store: MakeStore
) -> None:
    """Removed by one process and written again by another (no status yet) between two of
    a reader's refreshes: the reader's registry still names it, so only the log tells the
    reader to read it again; it then shows connecting, not the live it had."""
    writer, reader = fleet
    await writer.remove_worker(WORKERS[3])
    again = await make_store()
    await again.apply(WORKERS[3], Batch(0, time.time(), [EntriesStored([7], "GPU", 0, "s", None)]))

    after = await refreshed(reader)

    assert after[WORKERS[3]] is WorkerState.CONNECTING
    assert set(after.values()) == {WorkerState.LIVE, WorkerState.CONNECTING}


async def test_a_worker_logged_before_this_process_knows_it_leaves_the_mapping_as_it_was(
    fleet: tuple[RedisStore, RedisStore], make_store: MakeStore
) -> None:
    writer, _ = fleet
    reader = await _slow_reader(make_store)
    before = await reader.worker_states()
    await writer.set_status(WorkerKey("pod-new", 0), status(WorkerState.LIVE))
    reader._states.expire()  # the states due, the reader's registry not

    answers = [await reader.worker_states() for _ in range(3)]

    assert all(a is before for a in answers), "the new worker waits for the registry read"


async def test_a_refresh_overtaken_by_a_read_of_every_worker_leaves_its_result(
    fleet: tuple[RedisStore, RedisStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of every worker that began before a change and ends after a refresh that saw
    it puts back its older states and count; a refresh in flight meanwhile must not put its
    newer count on them (the change would be hidden until the next read of every worker)."""
    writer, reader = fleet
    cache = reader._states
    read = reader._meta_field
    full_read, full_go = asyncio.Event(), asyncio.Event()
    one_read, one_go = asyncio.Event(), asyncio.Event()

    async def held(workers: Sequence[WorkerKey], name: str) -> dict[WorkerKey, bytes | None]:
        out = await read(workers, name)
        if len(workers) > 1:
            full_read.set()
            await full_go.wait()
        elif len(workers) == 1 and workers[0] == WORKERS[7]:
            one_read.set()
            await one_go.wait()
        return out

    monkeypatch.setattr(reader, "_meta_field", held)
    full = asyncio.ensure_future(reader._read_field(cache))
    await full_read.wait()  # it read WORKERS[3] live
    await writer.set_status(WORKERS[3], status(WorkerState.DISCONNECTED))
    await reader._refresh_field(cache)
    assert cache.values[WORKERS[3]] is WorkerState.DISCONNECTED
    await writer.set_status(WORKERS[7], status(WorkerState.DISCONNECTED))
    second = asyncio.ensure_future(reader._refresh_field(cache))
    await one_read.wait()
    full_go.set()
    await full  # its older states and count
    one_go.set()
    await second

    await reader._refresh_field(cache)

    assert cache.values[WORKERS[3]] is WorkerState.DISCONNECTED
    assert cache.values[WORKERS[7]] is WorkerState.DISCONNECTED


async def test_a_listing_overtaken_by_a_refresh_leaves_its_states(
    fleet: tuple[RedisStore, RedisStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing that read a worker's meta before its change must not put its older state on
    the count a refresh reached meanwhile."""
    writer, reader = fleet
    rounds = reader._rounds
    listed, go = asyncio.Event(), asyncio.Event()

    async def held(commands: Sequence[Command], per_round: int) -> AsyncIterator[Any]:
        first = not listed.is_set()  # the listing's: the refresh's own rounds go on
        async for part, replies in rounds(commands, per_round):
            if first:
                listed.set()
                await go.wait()
            yield part, replies

    monkeypatch.setattr(reader, "_rounds", held)
    listing = asyncio.ensure_future(reader.list_workers())
    await listed.wait()  # it read WORKERS[3] live
    await writer.set_status(WORKERS[3], status(WorkerState.DISCONNECTED))
    await reader._refresh_field(reader._states)
    go.set()
    await listing

    assert (await reader.worker_states())[WORKERS[3]] is WorkerState.DISCONNECTED
