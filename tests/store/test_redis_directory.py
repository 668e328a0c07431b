"""The Redis session directory (store/README.md "Redis: session directory"): a session
lookup reads only the workers the session's directory set names, and the set names every
worker holding a residency of the session, whatever fails between the writes."""

from __future__ import annotations

import random
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError

import kvsi.store.redis.reads as reads_module
from kvsi.store.directory import DIRECTORY_MARK, hint_key, sessions_to_assert
from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    StoreEvent,
    WorkerCleared,
    WorkerKey,
)
from kvsi.store.records import Residency
from kvsi.store.redis import RedisStore
from kvsi.store.redis.layout import WorkerKeys, worker_member
from tests.redis_servers import RedisServer
from tests.store.conftest import MakeStore

WORKERS = [WorkerKey(f"pod-{i}", 0) for i in range(40)]


def stored(hashes: list[int], session: str | None) -> EntriesStored:
    return EntriesStored(hashes, "GPU", 0, session)


def hinted(raw: redis.Redis, prefix: str, session: str) -> set[str]:
    return {m.decode() for m in raw.zrange(hint_key(prefix, session), 0, -1)}


def calls(raw: redis.Redis, command: str) -> int:
    stats = raw.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


# -- the rule -------------------------------------------------------------------------------


def _held(total: int) -> Residency:
    res = Residency("s")
    res.total = total
    return res


@pytest.mark.parametrize(
    ("residency", "asserted_at", "due"),
    [
        (None, None, True),  # a residency the batch creates
        (0, 100.0, True),  # an empty one: another process may have dropped it
        (3, None, True),  # never asserted by this writer (a new process)
        (3, 10.0, True),  # asserted before the refresh time (the set's TTL)
        (3, 100.0, False),  # held, asserted recently: nothing to write
    ],
)
def test_which_sessions_a_batch_asserts(
    residency: int | None, asserted_at: float | None, due: bool
) -> None:
    residencies = {} if residency is None else {"s": _held(residency)}
    asserted = {} if asserted_at is None else {"s": asserted_at}
    batch = Batch(0, 1.0, [stored([1], "s"), stored([2], "s"), stored([3], None)])
    assert sessions_to_assert([batch], residencies, asserted, 50.0) == (["s"] if due else [])


def test_removals_and_clears_assert_nothing() -> None:
    batch = Batch(0, 1.0, [EntriesRemoved([1]), WorkerCleared()])
    assert sessions_to_assert([batch], {}, {}, 50.0) == []


# -- reads that do not fan out -------------------------------------------------------------


async def test_a_session_lookup_reads_only_the_workers_holding_it(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    store = await make_store()
    for i, worker in enumerate(WORKERS):
        await store.apply(worker, Batch(0, 10.0, [stored([i], f"own-{i}")]))
    for worker in WORKERS[3:5]:
        await store.apply(worker, Batch(1, 11.0, [stored([1000], "s")]))
    reader = await make_store()
    await reader.get_session("warm-up")  # loads the scripts

    before = calls(raw, "hget")
    view = await reader.get_session("s")

    assert view is not None and [w.pod for w in view.workers] == ["pod-3", "pod-4"]
    assert calls(raw, "hget") - before == 2, "one residency read per worker holding it"


async def test_lookups_answer_alike_on_a_cluster(make_store: MakeStore, server_url: str) -> None:
    writer, reader = await make_store(server_url), await make_store(server_url)
    for worker in WORKERS[:6]:
        await writer.apply(worker, Batch(0, 10.0, [stored([1, 2], "s"), stored([3], "t")]))
    await writer.apply(WORKERS[2], Batch(1, 12.0, [EntriesRemoved([1, 2])]))

    view = await reader.get_session("s")
    assert view is not None
    blocks = {w.pod: w.blocks for w in view.workers}
    assert blocks == {f"pod-{i}": 0 if i == 2 else 2 for i in range(6)}, "pod-2: lost, shown"
    assert view.total_blocks == 10 and view.last_seen == 10.0
    page = await reader.session_blocks("t", pod=None, medium=None, limit=10, cursor=None)
    assert page is not None and page.items == [3]


# -- failures between the two writes --------------------------------------------------------


class Crash(ConnectionError):
    """The process 'dies' here (a connection error is what the store treats as unknown)."""


def crash_apply(store: RedisStore, *, after: bool) -> None:
    """The store's next apply.lua call fails: before it reaches Redis, or after it landed."""
    real = store._apply_call

    async def once(keys: list[str], args: list[Any]) -> Any:
        store._apply_call = real
        if after:
            await real(keys, args)
        raise Crash("injected")

    store._apply_call = once


async def test_a_write_that_never_landed_leaves_an_entry_pruned_once_old(
    make_store: MakeStore, raw: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, reader = await make_store(), await make_store()
    await writer.apply(WORKERS[0], Batch(0, 10.0, [stored([1], "other")]))
    crash_apply(writer, after=False)
    with pytest.raises(Crash):
        await writer.apply(WORKERS[0], Batch(1, 11.0, [stored([2], "s")]))

    assert hinted(raw, prefix, "s") == {"pod-0/0"}, "asserted before the write"
    assert await reader.get_session("s") is None
    assert hinted(raw, prefix, "s") == {"pod-0/0"}, "young: its write may be in flight"

    monkeypatch.setattr(reads_module, "SAFE_SECONDS", -1.0)
    assert await reader.get_session("s") is None
    assert hinted(raw, prefix, "s") == set(), "old and no residency: pruned"


async def test_a_young_entry_of_a_write_in_flight_survives_a_read(
    make_store: MakeStore, raw: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, reader = await make_store(), await make_store()
    crash_apply(writer, after=False)
    with pytest.raises(Crash):
        await writer.apply(WORKERS[0], Batch(0, 10.0, [stored([1], "s")]))
    assert await reader.get_session("s") is None
    await writer.apply(WORKERS[0], Batch(0, 10.0, [stored([1], "s")]))  # the retry lands
    view = await reader.get_session("s")
    assert view is not None and view.total_blocks == 1


async def _truth_holders(raw: redis.Redis, prefix: str, session: str) -> set[str]:
    found = set()
    for worker in WORKERS[:3]:
        if raw.hexists(WorkerKeys(prefix, worker).res, session):
            found.add(worker_member(worker))
    return found


@pytest.mark.parametrize("seed", range(6))
async def test_crashes_between_the_writes_never_hide_a_residency(
    make_store: MakeStore, raw: redis.Redis, prefix: str, seed: int
) -> None:
    """Random batches on 3 workers, each write crashing at random before apply.lua, after it
    landed, or not at all; after a crash a new process (no mirror, nothing asserted)
    retries the batch. After every step each residency in Redis is in its session's set,
    and lookups through the directory answer as the memory store does."""
    rng = random.Random(seed)
    sessions = [f"s{i}" for i in range(8)]
    truth = MemoryStore()
    stores = {w: await make_store() for w in WORKERS[:3]}
    seqs = dict.fromkeys(WORKERS[:3], 0)
    resident: dict[WorkerKey, list[int]] = {w: [] for w in WORKERS[:3]}
    for step in range(60):
        worker = rng.choice(WORKERS[:3])
        events: list[StoreEvent] = []
        if resident[worker] and rng.random() < 0.3:
            gone = rng.sample(resident[worker], min(3, len(resident[worker])))
            resident[worker] = [h for h in resident[worker] if h not in gone]
            events.append(EntriesRemoved(gone))
        elif rng.random() < 0.05:
            resident[worker] = []
            events.append(WorkerCleared())
        else:
            hashes = [step * 10 + k for k in range(rng.randint(1, 3))]
            resident[worker] += hashes
            events.append(stored(hashes, rng.choice(sessions)))
        batch = Batch(seqs[worker], 10.0 + step, events)
        seqs[worker] += 1
        fate = rng.choice(["none", "before", "after"])
        if fate != "none":
            crash_apply(stores[worker], after=fate == "after")
            with pytest.raises(Crash):
                await stores[worker].apply(worker, batch)
            stores[worker] = await make_store()  # a new process takes over
        await stores[worker].apply(worker, batch)
        truth.apply_now(worker, batch)
        for session in sessions:
            holders = await _truth_holders(raw, prefix, session)
            assert holders <= hinted(raw, prefix, session), (step, session)
    reader = await make_store()
    for session in sessions:
        expected, got = await truth.get_session(session), await reader.get_session(session)
        assert (got is None) == (expected is None), session
        if got is not None and expected is not None:
            assert [(w.pod, w.blocks) for w in got.workers] == [
                (w.pod, w.blocks) for w in expected.workers
            ], session


# -- upkeep -----------------------------------------------------------------------------------


async def test_expiry_and_removal_take_the_worker_out_of_the_set(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    store = await make_store()
    await store.apply(WORKERS[0], Batch(0, 10.0, [stored([1], "idle"), stored([2], "kept")]))
    await store.apply(WORKERS[0], Batch(1, 50.0, [stored([3], "kept")]))
    await store.apply(WORKERS[1], Batch(0, 50.0, [stored([4], "kept")]))

    await store.expire_sessions(20.0, 100)
    assert hinted(raw, prefix, "idle") == set()
    assert hinted(raw, prefix, "kept") == {"pod-0/0", "pod-1/0"}

    await store.apply(WORKERS[0], Batch(2, 60.0, [stored([5], "idle")]))
    assert hinted(raw, prefix, "idle") == {"pod-0/0"}, "stored again: asserted again"

    await store.remove_worker(WORKERS[1])
    assert hinted(raw, prefix, "kept") == {"pod-0/0"}


def _forget_the_directory(raw: redis.Redis, prefix: str) -> None:
    """What an index written before the directory existed looks like."""
    for key in raw.scan_iter(f"{prefix}:dir:*"):
        raw.delete(key)
    for worker in WORKERS:
        raw.hdel(WorkerKeys(prefix, worker).meta, DIRECTORY_MARK)


async def test_an_index_from_before_the_directory_is_completed_by_its_writer_or_the_janitor(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    old = await make_store()
    await old.apply(WORKERS[0], Batch(0, 10.0, [stored([1], "written")]))
    await old.apply(WORKERS[1], Batch(0, 10.0, [stored([2], "unwritten")]))
    _forget_the_directory(raw, prefix)
    reader = await make_store()
    assert await reader.get_session("written") is None, "not found until completed"

    writer = await make_store()
    await writer.apply(WORKERS[0], Batch(1, 20.0, [stored([3], "new")]))
    assert hinted(raw, prefix, "written") == {"pod-0/0"}, "the writer's load completes it"

    assert await reader.get_session("unwritten") is None
    await reader.expire_sessions(0.0, 100)  # a janitor pass of an API replica
    view = await reader.get_session("unwritten")
    assert view is not None and view.total_blocks == 1
    assert raw.hget(WorkerKeys(prefix, WORKERS[1]).meta, DIRECTORY_MARK) is None
    await reader.expire_sessions(0.0, 100)  # nothing changed: not read again
    assert hinted(raw, prefix, "unwritten") == {"pod-1/0"}


async def test_a_new_worker_is_marked_complete_at_registration(
    make_store: MakeStore, raw: redis.Redis, prefix: str, redis_server: RedisServer
) -> None:
    store = await make_store()
    await store.apply(WORKERS[5], Batch(0, 10.0, [stored([1], "s")]))
    assert raw.hget(WorkerKeys(prefix, WORKERS[5]).meta, DIRECTORY_MARK) == b"1"
