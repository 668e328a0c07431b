"""The Redis store's entry index (prefix matches) and change feed (streams, pump, ids)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from redis.exceptions import ConnectionError
from structlog.testing import capture_logs

from kvsi.store.feed import FeedEntry, FeedHub, FeedRecord, ResidencyRow, entry_id, split_id
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    WorkerCleared,
    WorkerKey,
    WorkerState,
    WorkerStatus,
)
from kvsi.store.redis import RedisStore
from kvsi.store.redis import feed as feed_module
from kvsi.store.redis.feed import FeedPump
from kvsi.store.redis.layout import BUCKETS, bucket
from tests.redis_servers import RedisClusterServers
from tests.store.conftest import MakeStore
from tests.waiting import eventually

pytestmark = pytest.mark.redis

A = WorkerKey("pod-a.ns.svc.cluster.local", 0)
B = WorkerKey("pod-b", 3)
DIGEST = bytes(range(32))


def test_record_ids_with_dots_slashes_and_ats_split_back() -> None:
    for record in ("pod-a.ns.svc/0@1700000000000-3", "a.b/12@0-0", "p/0@1-0", "17"):
        for index in (0, 7, 123):
            assert split_id(entry_id(record, index)) == (record, index)
    for bad in ("pod.a/0@1-0", "pod/0@1-0.", "pod/0@1-0.x1", ".3"):
        with pytest.raises(ValueError):
            split_id(bad)


def _index(raw: redis.Redis, prefix: str, worker: WorkerKey, pid: int) -> dict[int, set[bytes]]:
    base = f"{prefix}:{{{worker.pod}/{worker.dp_rank}}}:e:{pid}:"
    keys = raw.keys(base + "*")
    return {int(k.decode().rpartition(":")[2]): raw.smembers(k) for k in keys}


async def test_the_entry_index_follows_entries_not_holders(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    store = await make_store()
    many = list(range(1000, 1000 + 3 * BUCKETS))
    await store.apply(A, Batch(0, 1.0, [EntriesStored(many, "GPU", 0, "s1")]))
    await store.apply(A, Batch(1, 2.0, [EntriesStored(many[:10], "GPU", 0, "s2")]))
    await store.apply(A, Batch(2, 3.0, [EntriesStored([DIGEST, 5], "GPU", 0, None)]))
    index = _index(raw, prefix, A, 0)
    assert len(index) == BUCKETS
    held = {m for members in index.values() for m in members}
    assert held == {str(h).encode() for h in [*many, 5]} | {b"\x00" + DIGEST}
    assert all(
        raw.object("encoding", f"{prefix}:{{{A.pod}/0}}:e:0:{b}") == b"intset"
        for b in range(BUCKETS)
        if b != bucket(DIGEST)
    )
    assert b"\x00" + DIGEST in index[bucket(DIGEST)]
    # Evicted entries leave the index, whether one session held them or two.
    await store.apply(A, Batch(3, 4.0, [EntriesRemoved([many[0], many[20]], "GPU", 0)]))
    index = _index(raw, prefix, A, 0)
    assert str(many[0]).encode() not in index[bucket(many[0])]
    assert str(many[20]).encode() not in index[bucket(many[20])]
    await store.mark_unconfirmed(A)
    await store.apply(A, Batch(4, 5.0, [EntriesStored(many[1:5], "GPU", 0, "s2")]))
    await store.drop_unconfirmed(A)
    assert {m for ms in _index(raw, prefix, A, 0).values() for m in ms} == {
        str(h).encode() for h in many[1:5]
    }
    assert await store.match_prefix(many[1:6], [A]) == {A: [("GPU",)] * 4}
    await store.apply(A, Batch(5, 6.0, [WorkerCleared(), EntriesStored([7], "CPU", 0, "s1")]))
    assert _index(raw, prefix, A, 0) == {}
    assert _index(raw, prefix, A, 1) == {bucket(7): {b"7"}}
    await store.clear_worker(A)
    assert _index(raw, prefix, A, 1) == {}
    await store.apply(A, Batch(6, 7.0, [EntriesStored([8], "GPU", 0, "s1")]))
    await store.remove_worker(A)
    assert raw.keys(f"{prefix}:{{{A.pod}/0}}:*") == []


async def test_a_worker_written_before_the_index_gets_it_on_its_next_write(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    writer = await make_store()
    await writer.apply(B, Batch(0, 1.0, [EntriesStored([1, 2, 3], "GPU", 0, "s")]))
    await writer.apply(B, Batch(1, 2.0, [EntriesStored([4], "CPU", 0, None)]))
    for key in raw.keys(f"{prefix}:{{pod-b/3}}:e:*"):  # as an older version wrote it
        raw.delete(key)
    raw.hdel(f"{prefix}:{{pod-b/3}}:meta", "idx")
    later = await make_store()  # a new process: its mirror loads from Redis
    assert await later.match_prefix([1, 2], [B]) == {}
    await later.apply(B, Batch(2, 3.0, [EntriesStored([5], "GPU", 0, "t")]))
    assert await later.match_prefix([1, 2, 3, 4, 5, 6], [B]) == {
        B: [("GPU",), ("GPU",), ("GPU",), ("CPU",), ("GPU",)]
    }


async def test_a_worker_that_gained_parts_is_matched_in_all_of_them(
    make_store: MakeStore,
) -> None:
    writer, reader = await make_store(), await make_store()
    await writer.apply(A, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s")]))
    assert await reader.match_prefix([1, 2], None) == {A: [("GPU",), ("GPU",)]}
    events = [EntriesStored([2], m, g, "s") for m, g in (("CPU", 0), ("disk", 0), ("GPU", 1))]
    await writer.apply(A, Batch(1, 2.0, events))
    got = await reader.match_prefix([1, 2], None)
    assert got == {A: [("GPU",), ("CPU", "GPU", "disk")]}


async def _received(hub_sub: Any, count: int) -> list[FeedEntry]:
    got: list[FeedEntry] = []

    async def enough() -> bool:
        while not hub_sub.queue.empty():
            got.append(await hub_sub.next())
        return len(got) >= count

    await eventually(enough)
    await asyncio.sleep(0.2)
    assert hub_sub.queue.empty()
    return got


async def test_two_writers_feed_each_batch_once_with_the_same_ids_on_every_replica(
    make_store: MakeStore,
) -> None:
    one, two = await make_store(), await make_store()
    readers = [await make_store(), await make_store()]
    subs = [(await r.change_feed()).subscribe(after=None) for r in readers]
    batches = [Batch(i, float(i), [EntriesStored([i], "GPU", 0, f"s{i % 3}")]) for i in range(20)]
    for batch in batches:  # both replicas of the sidecar apply every batch
        await asyncio.gather(one.apply(A, batch), two.apply(A, batch))
    await one.set_status(A, WorkerStatus(WorkerState.LIVE, 5.0))
    await two.set_status(A, WorkerStatus(WorkerState.LIVE, 5.0))
    first, second = [await _received(sub, 21) for sub in subs]
    assert [e.id for e in first] == [e.id for e in second]
    assert len(first) == 21
    assert first[0].id.startswith(f"{A.pod}/0@") and first[0].id.endswith(".0")


async def test_the_pump_starts_at_the_streams_end_survives_errors_and_stops_on_close(
    make_store: MakeStore,
) -> None:
    writer, reader = await make_store(), await make_store()
    await writer.apply(A, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "old")]))
    hub = await reader.change_feed()
    sub = hub.subscribe(after=None)
    pump = reader._pump
    assert isinstance(pump, FeedPump)
    real_xread = reader._client.xread
    failures = 3

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        nonlocal failures
        if failures:
            failures -= 1
            raise ConnectionError("injected")
        return await real_xread(*args, **kwargs)

    reader._client.xread = flaky  # type: ignore[method-assign]
    with capture_logs() as logged:
        await writer.apply(A, Batch(1, 2.0, [EntriesStored([2], "GPU", 0, "new")]))
        got = await _received(sub, 1)
    assert [(e.change.session_id, e.change.blocks) for e in got] == [("new", 1)]  # type: ignore[union-attr]
    assert failures == 0
    assert [e["event"] for e in logged] == ["feed.read_failed", "feed.read_again"]
    task = pump._task
    await reader.close()
    assert task is not None and task.done()


@pytest.mark.cluster
async def test_on_a_cluster_a_write_of_this_process_reaches_its_hub_without_the_poll(
    make_store: MakeStore, redis_cluster: RedisClusterServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pump polls a cluster every POLL_SECONDS (here an hour, after its first round);
    what this process's own writer applies wakes it for that worker's stream at once, while
    another process's write still waits for the poll."""
    store, other = await make_store(redis_cluster.url), await make_store(redis_cluster.url)
    await store.apply(A, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "old")]))
    await other.apply(B, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "theirs")]))
    monkeypatch.setattr(feed_module, "POLL_SECONDS", 3600.0)
    sub = (await store.change_feed()).subscribe(after=None)
    pump = store._pump
    assert isinstance(pump, FeedPump)
    await eventually(lambda: _idle(pump))  # its first round done, now waiting for the poll

    await other.apply(B, Batch(1, 2.0, [EntriesStored([2], "GPU", 0, "theirs")]))
    await store.apply(A, Batch(1, 2.0, [EntriesStored([2], "GPU", 0, "new")]))
    await store.apply_many(
        A, [Batch(s, float(s), [EntriesStored([s], "GPU", 0, f"run{s}")]) for s in (2, 3)]
    )
    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 5.0))
    got = await _received(sub, 4)
    changes = [(e.change.pod, getattr(e.change, "session_id", "")) for e in got]
    assert changes == [(A.pod, "new"), (A.pod, "run2"), (A.pod, "run3"), (A.pod, "")]


async def _idle(pump: FeedPump) -> bool:
    """Whether the pump waits for a wake-up or the poll (not reading)."""
    await asyncio.sleep(0.05)
    return pump._waiting


def test_records_round_trip_through_the_stream_encoding() -> None:
    import msgspec

    record = FeedRecord("p.q", 2, 3.5, (ResidencyRow("s", 1, 0, 1), ResidencyRow("t{x}", 0, 2, 0)))
    encoded = msgspec.msgpack.encode(record)
    assert msgspec.msgpack.decode(encoded, type=FeedRecord) == record
    # The stream's format is the one of rows as plain tuples: records written before read.
    as_tuples = ("p.q", 2, 3.5, (("s", 1, 0, 1), ("t{x}", 0, 2, 0)), None, False)
    assert msgspec.msgpack.encode(as_tuples) == encoded
    hub = FeedHub()
    hub.deliver("p.q/2@1-0", record)
    entries = [hub.subscribe(after="p.q/2@1-0.0")]
    assert entries[0].queue.qsize() == 1


async def test_store_urls_take_the_feed_length(make_store: MakeStore) -> None:
    store = await make_store(feed_length="10")
    assert store._feed_length == 10
    for bad in ("0", "x"):
        with pytest.raises(ValueError, match="feed_length"):
            RedisStore.from_url(f"redis://127.0.0.1:1?feed_length={bad}")
