"""The Redis directories (store/README.md "Redis: directories"): a session lookup reads only
the workers its session set names, a prefix match only those its first block's set names,
and the sets name every worker holding the session or the block, whatever fails between
the writes."""

from __future__ import annotations

import random
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError

import kvsi.store.redis.directories as directories_module
import kvsi.store.redis.reads as reads_module
from kvsi.store.directory import (
    BLOCK_DIRECTORY_MARK,
    DIRECTORY_MARK,
    block_key,
    firsts_to_assert,
    hint_key,
    sessions_to_assert,
)
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
from tests.redis_servers import RedisClusterServers, RedisServer
from tests.store.conftest import MakeStore

WORKERS = [WorkerKey(f"pod-{i}", 0) for i in range(40)]


def stored(hashes: list[int], session: str | None, parent: int | None = 0) -> EntriesStored:
    """A store continuing a prompt (`parent` 0), or starting one (`parent` None)."""
    return EntriesStored(hashes, "GPU", 0, session, parent)


def started(hashes: list[int], session: str | None = None) -> EntriesStored:
    """A store of a prompt's first blocks (no parent)."""
    return stored(hashes, session, None)


def hinted(raw: redis.Redis, prefix: str, session: str) -> set[str]:
    return {m.decode() for m in raw.zrange(hint_key(prefix, session), 0, -1)}


def block_hinted(raw: redis.Redis, prefix: str, h: int) -> set[str]:
    return {m.decode() for m in raw.zrange(block_key(prefix, h), 0, -1)}


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


class DecodedStore(EntriesStored, frozen=True):
    """A subclass, as subscriber/decode.py reads the wire straight into store events."""


def test_a_decoded_store_asserts_like_any_other() -> None:
    batch = Batch(0, 1.0, [DecodedStore([1], "GPU", 0, "s")])
    assert sessions_to_assert([batch], {}, {}, 50.0) == ["s"]


def test_removals_and_clears_assert_nothing() -> None:
    batch = Batch(0, 1.0, [EntriesRemoved([1]), WorkerCleared()])
    assert sessions_to_assert([batch], {}, {}, 50.0) == []


@pytest.mark.parametrize(
    ("event", "held", "asserted_at", "restarted", "due"),
    [
        (started([7, 8]), False, None, False, [7]),  # a prompt's first block, new here
        (started([7, 8]), True, 100.0, False, []),  # held and asserted recently
        (started([7, 8]), True, None, False, [7]),  # held, not asserted by this writer
        (started([7, 8]), True, 10.0, False, [7]),  # asserted before the refresh time
        (started([7, 8]), True, 100.0, True, [7]),  # the engine restarted: dropped, stored
        (stored([7, 8], None), False, None, False, []),  # mid-prompt: not a first block
        (started([]), False, None, False, []),
    ],
)
def test_which_first_blocks_a_batch_asserts(
    event: EntriesStored, held: bool, asserted_at: float | None, restarted: bool, due: list[int]
) -> None:
    asserted = {} if asserted_at is None else {7: asserted_at}
    batch = Batch(0, 1.0, [event])
    got = firsts_to_assert([batch], lambda h: held, asserted, 50.0, restarted=restarted)
    assert got == due


def test_a_first_block_stored_after_a_clear_in_the_batch_is_asserted() -> None:
    batch = Batch(0, 1.0, [WorkerCleared(), started([7])])
    assert firsts_to_assert([batch], lambda h: True, {7: 100.0}, 50.0) == [7]


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


async def test_a_prefix_match_reads_only_the_workers_holding_the_first_block(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    store = await make_store()
    for i, worker in enumerate(WORKERS):
        await store.apply(worker, Batch(0, 10.0, [started([i + 1])]))
    for worker in WORKERS[3:5]:
        await store.apply(worker, Batch(1, 11.0, [started([1000]), stored([1001], None)]))
    reader = await make_store()
    await reader.match_prefix([1], None)  # loads the script, learns the workers' marks

    before = calls(raw, "hgetall")
    held = await reader.match_prefix([1000, 1001, 1002], None)

    assert calls(raw, "hgetall") - before == 2, "one parts hash per worker holding it"
    assert {w.pod: m for w, m in held.items()} == {
        "pod-3": [("GPU",), ("GPU",)],
        "pod-4": [("GPU",), ("GPU",)],
    }, "only the workers holding the first block answer"


async def test_prefix_matches_answer_alike_on_a_cluster(
    make_store: MakeStore, server_url: str
) -> None:
    writer, reader = await make_store(server_url), await make_store(server_url)
    for worker in WORKERS[:6]:
        await writer.apply(worker, Batch(0, 10.0, [started([1, 2], "s")]))
    await writer.apply(WORKERS[2], Batch(1, 12.0, [EntriesRemoved([1, 2])]))
    await writer.apply(WORKERS[3], Batch(1, 12.0, [EntriesRemoved([2])]))

    held = await reader.match_prefix([1, 2], WORKERS[1:5])

    assert {w.pod: len(m) for w, m in held.items()} == {"pod-1": 2, "pod-3": 1, "pod-4": 2}


async def test_an_evicted_first_block_leaves_an_entry_pruned_once_old(
    make_store: MakeStore,
    raw: redis.Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    server_url: str,
) -> None:
    writer, reader = await make_store(server_url), await make_store(server_url)
    await writer.apply(WORKERS[0], Batch(0, 10.0, [started([5])]))
    await writer.apply(WORKERS[0], Batch(1, 11.0, [EntriesRemoved([5])]))
    client = writer._client

    async def named() -> set[str]:
        found = await client.zrange(block_key(prefix, 5), 0, -1)
        return {m.decode() for m in found}

    assert await reader.match_prefix([5], None) == {}
    assert await named() == {"pod-0/0"}, "young: kept"
    monkeypatch.setattr(reads_module, "SAFE_SECONDS", -1.0)
    assert await reader.match_prefix([5], None) == {}
    assert await named() == set(), "old and not held: pruned"
    await writer.apply(WORKERS[0], Batch(2, 12.0, [started([5])]))
    assert await named() == {"pod-0/0"}, "stored again: asserted again"
    assert (await reader.match_prefix([5], None))[WORKERS[0]] == [("GPU",)]


async def test_a_worker_from_before_the_block_directory_is_read_until_it_clears(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    old = await make_store()
    await old.apply(WORKERS[0], Batch(0, 10.0, [started([1], "s")]))
    for key in raw.scan_iter(f"{prefix}:blk:*"):
        raw.delete(key)
    raw.hdel(WorkerKeys(prefix, WORKERS[0]).meta, BLOCK_DIRECTORY_MARK)
    reader = await make_store()

    assert (await reader.match_prefix([1], None))[WORKERS[0]] == [("GPU",)], "read as before"

    writer = await make_store()
    await writer.clear_worker(WORKERS[0])
    assert raw.hget(WorkerKeys(prefix, WORKERS[0]).meta, BLOCK_DIRECTORY_MARK) == b"1"
    await writer.apply(WORKERS[0], Batch(1, 20.0, [started([1], "s")]))
    assert block_hinted(raw, prefix, 1) == {"pod-0/0"}
    assert (await reader.match_prefix([1], None))[WORKERS[0]] == [("GPU",)]


async def test_the_janitor_keeps_held_first_blocks_asserted_and_forgets_the_rest(
    make_store: MakeStore, raw: redis.Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await make_store()
    await store.apply(WORKERS[0], Batch(0, 10.0, [started([1]), started([2])]))
    await store.apply(WORKERS[0], Batch(1, 11.0, [EntriesRemoved([2])]))
    firsts = WorkerKeys(prefix, WORKERS[0]).firsts
    assert raw.smembers(firsts) == {b"1", b"2"}
    raw.delete(block_key(prefix, 1))  # as if its TTL ran out

    monkeypatch.setattr(directories_module, "DIRECTORY_TTL", 0.0)
    await store.expire_sessions(0.0, 100)

    assert raw.smembers(firsts) == {b"1"}, "the evicted one forgotten"
    assert block_hinted(raw, prefix, 1) == {"pod-0/0"}, "the held one asserted again"


async def test_a_new_writer_asserts_the_first_blocks_it_loads(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    old = await make_store()
    await old.apply(WORKERS[0], Batch(0, 10.0, [started([1])]))
    raw.delete(block_key(prefix, 1))
    await (await make_store()).apply(WORKERS[0], Batch(1, 11.0, [stored([9], None)]))
    assert block_hinted(raw, prefix, 1) == {"pod-0/0"}


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


async def named(store: RedisStore, key: str) -> set[str]:
    """The members of a directory set, through the store's own client (either server)."""
    return {m.decode() for m in await store._client.zrange(key, 0, -1)}


async def test_a_write_that_never_landed_leaves_an_entry_pruned_once_old_on_a_cluster(
    make_store: MakeStore,
    redis_cluster: RedisClusterServers,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer, reader = await make_store(redis_cluster.url), await make_store(redis_cluster.url)
    await writer.apply(WORKERS[0], Batch(0, 10.0, [stored([1], "other")]))
    crash_apply(writer, after=False)
    with pytest.raises(Crash):
        await writer.apply(WORKERS[0], Batch(1, 11.0, [stored([2], "s")]))
    key = hint_key(prefix, "s")

    assert await named(writer, key) == {"pod-0/0"}, "asserted before the write"
    assert await reader.get_session("s") is None
    assert await named(writer, key) == {"pod-0/0"}, "young: its write may be in flight"

    monkeypatch.setattr(reads_module, "SAFE_SECONDS", -1.0)
    assert await reader.get_session("s") is None
    assert await named(writer, key) == set(), "old and no residency: pruned"


async def test_on_a_standalone_server_the_asserts_land_with_the_write_or_not_at_all(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    writer = await make_store()
    crash_apply(writer, after=False)
    with pytest.raises(Crash):
        await writer.apply(WORKERS[0], Batch(0, 10.0, [started([1, 2], "s")]))
    assert hinted(raw, prefix, "s") == set() and block_hinted(raw, prefix, 1) == set()
    await writer.apply(WORKERS[0], Batch(0, 10.0, [started([1, 2], "s")]))
    assert hinted(raw, prefix, "s") == {"pod-0/0"} and block_hinted(raw, prefix, 1) == {"pod-0/0"}


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


async def _truth_holders(store: RedisStore, prefix: str, session: str) -> set[str]:
    found = set()
    for worker in WORKERS[:3]:
        if await store._client.hexists(WorkerKeys(prefix, worker).res, session):
            found.add(worker_member(worker))
    return found


@pytest.mark.parametrize("seed", range(6))
async def test_crashes_between_the_writes_never_hide_a_residency(
    make_store: MakeStore, server_url: str, prefix: str, seed: int
) -> None:
    """Random batches on 3 workers, each write crashing at random before apply.lua, after it
    landed, or not at all; after a crash a new process (no mirror, nothing asserted)
    retries the batch. After every step each residency in Redis is in its session's set and
    each held first block in its block set; lookups and prefix matches through the
    directories answer as the memory store does."""
    rng = random.Random(seed)
    sessions = [f"s{i}" for i in range(8)]
    truth = MemoryStore()
    stores = {w: await make_store(server_url) for w in WORKERS[:3]}
    looker = await make_store(server_url)
    seqs = dict.fromkeys(WORKERS[:3], 0)
    resident: dict[WorkerKey, list[int]] = {w: [] for w in WORKERS[:3]}
    firsts: list[int] = []
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
            parent = None if rng.random() < 0.5 else 0
            events.append(stored(hashes, rng.choice(sessions), parent))
            if parent is None:
                firsts.append(hashes[0])
        batch = Batch(seqs[worker], 10.0 + step, events)
        seqs[worker] += 1
        fate = rng.choice(["none", "before", "after"])
        if fate != "none":
            crash_apply(stores[worker], after=fate == "after")
            with pytest.raises(Crash):
                await stores[worker].apply(worker, batch)
            stores[worker] = await make_store(server_url)  # a new process takes over
        await stores[worker].apply(worker, batch)
        truth.apply_now(worker, batch)
        for session in sessions:
            holders = await _truth_holders(looker, prefix, session)
            assert holders <= await named(looker, hint_key(prefix, session)), (step, session)
        for h in firsts:
            holding = {worker_member(w) for w in WORKERS[:3] if h in resident[w]}
            assert holding <= await named(looker, block_key(prefix, h)), (step, h)
    reader = await make_store(server_url)
    for session in sessions:
        expected, got = await truth.get_session(session), await reader.get_session(session)
        assert (got is None) == (expected is None), session
        if got is not None and expected is not None:
            assert [(w.pod, w.blocks) for w in got.workers] == [
                (w.pod, w.blocks) for w in expected.workers
            ], session
    for h in firsts:
        prompt = [h, h + 1, h + 2]
        assert await reader.match_prefix(prompt, None) == await truth.match_prefix(prompt, None)


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
