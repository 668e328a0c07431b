"""Writers of one worker's stream on Redis: replicas, lagging mirrors, lost replies.

Every test compares with the memory store (the reference backend) through everything the read
side can tell, read by a store instance that never wrote (an API-only replica).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis.exceptions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    ApplyOutcome,
    Batch,
    EntriesRemoved,
    EntriesStored,
    StoreEvent,
    WorkerKey,
)
from kvsi.store.redis import RedisStore
from kvsi.store.redis.mirror import VLOG_LENGTH
from tests.conformance.checks import events
from tests.redis_servers import RedisServer, require
from tests.store.conftest import MakeStore
from tests.store.snapshots import A, B, snapshot

pytestmark = pytest.mark.redis

SKIPPED = (ApplyOutcome.DUPLICATE, ApplyOutcome.PREVIOUS_ENGINE)


batches = st.tuples(
    st.just("batch"),
    st.sampled_from([A, B]),
    st.integers(min_value=0, max_value=6),
    st.integers(min_value=0, max_value=6).map(float),
    st.lists(events, max_size=4),
    st.sampled_from(["one", "both", "later"]),
    st.booleans(),
)
worker_ops = st.tuples(
    st.sampled_from(["mark", "drop", "clear", "remove"]), st.sampled_from([A, B])
)
plans = st.lists(
    st.one_of(
        batches,
        batches,
        batches,
        worker_ops,
        st.tuples(st.just("expire"), st.integers(min_value=0, max_value=8).map(float)),
        st.tuples(st.just("catch_up")),
    ),
    max_size=30,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=plans)
async def test_two_writers_and_a_reader_match_the_memory_store(
    make_store: MakeStore, plan: list[tuple[Any, ...]]
) -> None:
    """Two replicas write the same streams, one trailing at will; every worker op and expiry
    goes through either. The index read by a third instance equals the memory store's."""
    fleet = f"t-{uuid.uuid4().hex[:12]}"  # one index per example
    writers = [await make_store(prefix=fleet), await make_store(prefix=fleet)]
    reader = await make_store(prefix=fleet)
    ref = MemoryStore()
    late: list[tuple[RedisStore, WorkerKey, Batch]] = []

    async def catch_up(worker: WorkerKey | None = None) -> None:
        for item in [x for x in late if worker is None or x[1] == worker]:
            late.remove(item)
            assert await item[0].apply(item[1], item[2]) in SKIPPED

    for step in plan:
        if step[0] == "batch":
            _, worker, seq, ts, evs, mode, second = step
            batch = Batch(seq, ts, evs)
            first, other = writers if not second else writers[::-1]
            assert await first.apply(worker, batch) == await ref.apply(worker, batch)
            if mode == "both":
                assert await other.apply(worker, batch) in SKIPPED
            elif mode == "later":
                late.append((other, worker, batch))
        elif step[0] == "expire":
            expected = await ref.expire_sessions(step[1], 1000)
            # Every process runs the janitor; the first to get there expires the sessions.
            counts = [await s.expire_sessions(step[1], 1000) for s in (*writers, reader)]
            assert sum(c.sessions for c in counts) == expected.sessions
            assert sum(c.residencies for c in counts) == expected.residencies
        elif step[0] == "catch_up":
            await catch_up()
        else:
            name, worker = step
            if name == "remove":
                await catch_up(worker)  # a removed worker's stream has ended
                await writers[0].remove_worker(worker)
                await ref.remove_worker(worker)
            elif name == "clear":
                await writers[1].clear_worker(worker)
                await ref.clear_worker(worker)
            elif name == "mark":
                assert await writers[0].mark_unconfirmed(worker) == await ref.mark_unconfirmed(
                    worker
                )
            else:
                assert await writers[1].drop_unconfirmed(worker) == await ref.drop_unconfirmed(
                    worker
                )
    await catch_up()
    assert await snapshot(reader) == await snapshot(ref)


async def test_a_writer_trailing_the_other_follows_without_reloading(make_store: MakeStore) -> None:
    leader, trailer, reader = await make_store(), await make_store(), await make_store()
    ref = MemoryStore()
    loads = 0
    load = trailer._load

    async def counting(w: Any) -> Any:
        nonlocal loads
        loads += 1
        return await load(w)

    trailer._load = counting  # type: ignore[method-assign]
    stream = [
        Batch(
            i, float(i), [EntriesStored([i, i + 1], "GPU", 0, f"s{i % 3}"), EntriesRemoved([i - 2])]
        )
        for i in range(3 * VLOG_LENGTH)
    ]
    await trailer.apply(A, stream[0])  # the trailer builds its mirror once
    await leader.apply(A, stream[0])
    for batch in stream:
        await ref.apply(A, batch)
    lag = VLOG_LENGTH // 2
    for i, batch in enumerate(stream[1:], 1):
        await leader.apply(A, batch)
        if i >= lag:
            assert await trailer.apply(A, stream[i - lag + 1]) is ApplyOutcome.DUPLICATE
    assert loads == 1
    # The leader stops: the trailer catches up and takes over without reloading.
    for batch in stream[len(stream) - lag + 1 :]:
        assert await trailer.apply(A, batch) is ApplyOutcome.DUPLICATE
    last = Batch(len(stream), 99.0, [EntriesStored([7], "CPU", 0, "s1")])
    assert await trailer.apply(A, last) is ApplyOutcome.APPLIED
    await ref.apply(A, last)
    assert loads == 1
    assert await snapshot(reader) == await snapshot(ref)


async def test_a_writer_far_behind_reloads_once_when_it_takes_over(make_store: MakeStore) -> None:
    leader, trailer, reader = await make_store(), await make_store(), await make_store()
    ref = MemoryStore()
    stream = [
        Batch(i, float(i), [EntriesStored([i], "GPU", 0, "s1"), EntriesRemoved([i - 3])])
        for i in range(3 * VLOG_LENGTH)
    ]
    await trailer.apply(A, stream[0])
    for batch in stream:
        await leader.apply(A, batch)
        await ref.apply(A, batch)
    for batch in stream[1:]:
        assert await trailer.apply(A, batch) is ApplyOutcome.DUPLICATE
    assert trailer._writers[A].mirror is None  # too far behind to follow: dropped, not reloaded
    last = Batch(len(stream), 99.0, [EntriesRemoved([len(stream) - 1])])
    assert await trailer.apply(A, last) is ApplyOutcome.APPLIED
    await ref.apply(A, last)
    assert await snapshot(reader) == await snapshot(ref)


@pytest.mark.parametrize("lands", [True, False], ids=["reply-lost", "never-sent"])
async def test_a_failed_call_leaves_no_stale_mirror(make_store: MakeStore, lands: bool) -> None:
    """A connection error mid-apply: the write may have landed or not. The retry of the same
    batch must end in the same index either way, and the next batches apply on top of it."""
    store, reader = await make_store(), await make_store()
    ref = MemoryStore()
    first = Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s1")])
    second = Batch(1, 2.0, [EntriesStored([3], "GPU", 0, "s2"), EntriesRemoved([1])])
    third = Batch(2, 3.0, [EntriesRemoved([2, 3])])
    for batch in (first, second, third):
        await ref.apply(A, batch)
    await store.apply(A, first)
    call = store._apply_call

    async def failing(keys: list[str], args: list[Any]) -> Any:
        store._apply_call = call
        if lands:
            await call(keys, args)
        raise redis.exceptions.ConnectionError("connection reset")

    store._apply_call = failing
    with pytest.raises(redis.exceptions.ConnectionError):
        await store.apply(A, second)
    assert store._writers[A].mirror is None
    retried = await store.apply(A, second)
    assert retried is (ApplyOutcome.DUPLICATE if lands else ApplyOutcome.APPLIED)
    assert await store.apply(A, third) is ApplyOutcome.APPLIED
    assert await snapshot(reader) == await snapshot(ref)


async def test_unknown_workers_stay_unknown(make_store: MakeStore) -> None:
    store = await make_store()
    assert await store.mark_unconfirmed(A) == 0
    assert await store.drop_unconfirmed(A) == 0
    await store.clear_worker(A)
    await store.remove_worker(A)
    assert await store.list_workers() == []
    assert await store.fence(A) is None
    assert (
        await store.worker_blocks("pod-a", dp_rank=None, medium=None, limit=1, cursor=None) is None
    )


async def test_big_batches_are_split_into_several_commands(make_store: MakeStore) -> None:
    """Lua's unpack takes at most 8000 values: longer member lists go in several commands."""
    store, reader = await make_store(), await make_store()
    ref = MemoryStore()
    hashes = list(range(1, 20_001))
    evs: list[StoreEvent] = [
        EntriesStored(hashes, "GPU", 0, "s1"),
        EntriesStored(hashes, "GPU", 0, None),
    ]
    for batch in (
        Batch(0, 1.0, evs),
        Batch(1, 2.0, [EntriesRemoved(hashes[::2])]),
    ):
        assert await store.apply(A, batch) == await ref.apply(A, batch)
    assert await store.mark_unconfirmed(A) == await ref.mark_unconfirmed(A) == 10_000
    assert await store.drop_unconfirmed(A) == await ref.drop_unconfirmed(A)
    assert await snapshot(reader) == await snapshot(ref)


async def test_redis_errors_propagate_and_the_store_recovers(prefix: str) -> None:
    """Stopped server: every call raises (the API answers 503, ingest buffers). Back (empty,
    as without persistence): the writer notices its mirror is stale and carries on."""
    require("redis-server")
    server = RedisServer()
    server.start()
    store = RedisStore.from_url(f"{server.url}?prefix={prefix}&registry_ttl=0")
    try:
        await store.apply(A, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s1")]))
        server.stop()
        with pytest.raises(redis.exceptions.ConnectionError):
            await store.apply(A, Batch(1, 2.0, [EntriesStored([2], "GPU", 0, "s1")]))
        with pytest.raises(redis.exceptions.ConnectionError):
            await store.get_session("s1")
        server.start(server.port)
        assert await store.apply(A, Batch(2, 3.0, [EntriesStored([3], "GPU", 0, "s1")])) is (
            ApplyOutcome.APPLIED
        )
        view = await store.get_session("s1")
        assert view is not None and view.total_blocks == 1
    finally:
        await store.close()
        server.remove()


async def test_expiry_goes_through_the_writers_mirror_and_a_replica_leaves_it_blocks(
    make_store: MakeStore,
) -> None:
    """A replica without the worker's mirror drops only idle residencies holding no block;
    the writer drops the rest through its mirror (version-guarded), which stays exact: its
    next batches need no reload, and an eviction after the expiry matches the memory store."""
    writer, replica, reader = await make_store(), await make_store(), await make_store()
    ref = MemoryStore()
    loads = 0
    load = writer._load

    async def counting(w: Any) -> Any:
        nonlocal loads
        loads += 1
        return await load(w)

    writer._load = counting  # type: ignore[method-assign]
    prompt = [101, 102]
    stream = [
        Batch(0, 10.0, [EntriesStored([*prompt, 1], "GPU", 0, "a"),
                        EntriesStored([*prompt, 2], "GPU", 0, "b"),
                        EntriesStored([3], "GPU", 0, "empty"), EntriesRemoved([3])]),
        Batch(1, 50.0, [EntriesStored([*prompt, 4], "GPU", 0, "c")]),
    ]  # fmt: skip
    for batch in stream:
        assert await writer.apply(A, batch) == await ref.apply(A, batch)
    done = await replica.expire_sessions(20.0, 100)
    assert (done.residencies, done.sessions) == (1, 1)  # "empty" only
    done = await writer.expire_sessions(20.0, 100)
    assert (done.residencies, done.sessions) == (2, 2)  # "a" and "b"; "empty" was gone
    assert (await ref.expire_sessions(20.0, 100))[:2] == (3, 3)
    later = [
        Batch(2, 60.0, [EntriesRemoved([101, 1]), EntriesStored([2, 5], "GPU", 0, "a")]),
        Batch(3, 61.0, [EntriesStored([3], "GPU", 0, "empty")]),
    ]
    for batch in later:
        assert await writer.apply(A, batch) == await ref.apply(A, batch)
    assert loads == 1
    assert await snapshot(reader) == await snapshot(ref)
    mirror = writer._writers[A].mirror
    assert mirror is not None
    assert list(mirror.index.residencies) == ["c", "a", "empty"]  # last-store order


async def test_a_second_writer_loads_dynamos_edges_and_unlinks_what_it_evicts(
    make_store: MakeStore,
) -> None:
    """A writer taking over a worker (a restart, another replica) loads its Dynamo edges with
    its mirror: a removal it applies drops the edge from Redis too, and a store links on."""
    first, second, reader = await make_store(), await make_store(), await make_store()
    chain = EntriesStored([2**64 - 3, 11], "GPU", tokens_hashes=[101, 2**64 - 1])
    await first.apply(A, Batch(1, 1.0, [chain]))

    await second.apply(
        A,
        Batch(
            2,
            2.0,
            [
                EntriesRemoved([11], "GPU"),
                EntriesStored([12], "GPU", parent_block_hash=2**64 - 3, tokens_hashes=[102]),
            ],
        ),
    )

    assert await reader.token_edges(A) == {2**64 - 3: (None, 101), 12: (2**64 - 3, 102)}
    assert await reader.match_tokens([101, 102], [A]) == {A: [("GPU",), ("GPU",)]}
    assert await reader.match_tokens([101, 2**64 - 1], [A]) == {A: [("GPU",)]}
