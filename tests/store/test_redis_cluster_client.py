"""The cluster client's callers wait for a connection instead of failing
(store/redis/cluster_client.py), and a store loads at most LOADS mirrors at once
(store/redis/store.py): the warm-up of a process that starts following a fleet."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import RedisCluster
from redis.exceptions import ConnectionError, MaxConnectionsError, ResponseError

from kvsi.store.model import ApplyOutcome, Batch, EntriesStored, StoreEvent, WorkerKey
from kvsi.store.redis import RedisStore
from kvsi.store.redis.cluster_client import SPARE, Places, WaitingCluster
from kvsi.store.redis.node_reads import NodeReads
from kvsi.store.redis.store import LOAD_CALLS, LOAD_SETS, LOADS, open_client
from tests.redis_servers import RedisClusterServers
from tests.store.conftest import MakeStore

CALLERS = 64


def plain_url(cluster: RedisClusterServers) -> str:
    """The cluster's URL as redis-py takes it."""
    return cluster.url.replace("+cluster", "", 1)


def most_connections(client: RedisCluster) -> int:
    """The most connections any node of the client opened."""
    return max(len(node._connections) for node in client.get_nodes())


@pytest.fixture
async def waiting(redis_cluster: RedisClusterServers) -> AsyncIterator[WaitingCluster]:
    client, _ = open_client(f"{redis_cluster.url}?max_connections=2")
    assert isinstance(client, WaitingCluster)
    yield client
    await client.aclose()


@pytest.mark.cluster
async def test_callers_past_the_calls_wait_for_a_connection(
    waiting: WaitingCluster, redis_cluster: RedisClusterServers
) -> None:
    """64 commands and 64 pipelines at once on a client of 2 calls all answer, and no node
    opens more than 2 connections; redis-py's own client of that size fails them."""
    keys = [f"k{i}" for i in range(CALLERS)]
    await waiting.mset_nonatomic({k: k for k in keys})

    async def piped(key: str) -> list[Any]:
        pipe = waiting.pipeline()
        pipe.get(key)
        pipe.strlen(key)
        return list(await pipe.execute())

    gets = await asyncio.gather(*(waiting.get(k) for k in keys))
    pipes = await asyncio.gather(*(piped(k) for k in keys))
    assert gets == [k.encode() for k in keys]
    assert pipes == [[k.encode(), len(k)] for k in keys]
    assert most_connections(waiting) <= 2

    plain = RedisCluster.from_url(plain_url(redis_cluster), max_connections=2)
    try:
        with pytest.raises(MaxConnectionsError):
            await asyncio.gather(*(plain.get(k) for k in keys))
    finally:
        await plain.aclose()


@pytest.mark.cluster
async def test_a_caller_waits_at_most_the_pool_wait(redis_cluster: RedisClusterServers) -> None:
    """With its one call held by a blocking read, a second caller gets ConnectionError
    naming the wait after `wait` seconds, and the first still answers."""
    client = WaitingCluster.from_url(plain_url(redis_cluster), calls=1, wait=0.2)
    try:
        blocked = asyncio.create_task(client.blpop(["nothing-here"], timeout=1))
        await asyncio.sleep(0.1)
        with pytest.raises(ConnectionError, match=r"within 0\.2 s \(1 calls in flight\)"):
            await client.get("k")
        assert await blocked is None
        assert await client.get("k") is None
    finally:
        await client.aclose()


@pytest.mark.cluster
async def test_a_call_made_inside_a_held_place_does_not_queue(waiting: WaitingCluster) -> None:
    """Inside a call that holds every place (redis-py sending a redirected command again
    within a pipeline's execution), a command runs at once instead of waiting for itself."""

    async def inner() -> bytes | None:
        assert await asyncio.wait_for(waiting.set("inner", "1"), 1.0)
        return await asyncio.wait_for(waiting.get("inner"), 1.0)

    async def both() -> bytes | None:
        return await waiting.held(inner())

    assert await waiting.held(both()) == b"1"


@pytest.mark.cluster
def test_the_urls_max_connections_is_the_calls_in_flight(
    redis_cluster: RedisClusterServers,
) -> None:
    """`max_connections` sets the calls (the node pools get SPARE more); bad values are
    refused naming the option."""
    client, options = open_client(f"{redis_cluster.url}?max_connections=7&prefix=x")
    assert isinstance(client, WaitingCluster)
    assert (client.calls, options) == (7, {"prefix": "x"})
    assert client.connection_kwargs["max_connections"] == 7 + SPARE
    default, _ = open_client(redis_cluster.url)
    assert isinstance(default, WaitingCluster) and default.calls == 64
    for bad in ("1", "0", "-1", "many"):
        with pytest.raises(ValueError, match="max_connections must be an integer of at least 2"):
            open_client(f"{redis_cluster.url}?max_connections={bad}")


def counting(store: RedisStore) -> Callable[[], int]:
    """Count the store's loads in flight at once (its `_load_now`); the most, when asked."""
    inner: Callable[[Any], Awaitable[Any]] = store._load_now
    now = most = 0

    async def load(w: Any) -> Any:
        nonlocal now, most
        now += 1
        most = max(most, now)
        try:
            await asyncio.sleep(0.01)  # a load's round trips, long enough to overlap
            return await inner(w)
        finally:
            now -= 1

    store._load_now = load  # type: ignore[method-assign]
    return lambda: most


@pytest.mark.parametrize("server", ["redis", pytest.param("cluster", marks=pytest.mark.cluster)])
async def test_a_store_loads_at_most_loads_mirrors_at_once(
    make_store: MakeStore, request: pytest.FixtureRequest, server: str
) -> None:
    """A process that starts following 24 workers (each written by another) loads their
    mirrors LOADS at a time, and every write lands."""
    url = request.getfixturevalue("redis_cluster" if server == "cluster" else "redis_server").url
    workers = [WorkerKey(f"pod-{i}", 0) for i in range(24)]

    def batch(seq: int, first: int) -> Batch:
        return Batch(seq, 10.0 + seq, [EntriesStored([first, first + 1], "GPU", 0, "s", None)])

    before = await make_store(url)
    for i, w in enumerate(workers):
        await before.apply(w, batch(0, 1000 * i))
    after = await make_store(url)
    most = counting(after)
    await asyncio.gather(*(after.apply(w, batch(1, 1000 * i + 2)) for i, w in enumerate(workers)))
    assert most() == LOADS
    session = await after.get_session("s")
    assert session is not None
    assert sorted(p.blocks for p in session.workers) == [4] * len(workers)


@pytest.mark.cluster
async def test_the_readers_direct_path_holds_a_place(redis_cluster: RedisClusterServers) -> None:
    """NodeReads takes its connections within a place: with the only one held elsewhere,
    its round answers after that place is given back, not beside it."""
    client = WaitingCluster.from_url(plain_url(redis_cluster), calls=1, wait=5.0)
    reads = NodeReads(client)
    given_back = False

    async def given() -> None:
        nonlocal given_back
        await asyncio.sleep(0.2)
        given_back = True

    async def hold() -> None:
        await client.held(given())

    try:
        await client.set("k", "v")
        holding = asyncio.create_task(hold())
        await asyncio.sleep(0.05)
        assert await reads.run([("k", ("GET", "k"), {})]) == [b"v"]
        assert given_back
        await holding
    finally:
        await client.aclose()


async def test_places_are_handed_over_in_line_order() -> None:
    """Past its size a taker waits; places go to the waiters first come first served, and
    a free place is not taken past someone waiting for it."""
    places = Places(1)
    assert places.take_now()
    assert not places.take_now()
    order: list[str] = []

    async def taker(name: str) -> None:
        await places.take()
        order.append(name)

    waiting = [asyncio.create_task(taker(n)) for n in "abc"]
    await asyncio.sleep(0)
    places.give_back()
    await asyncio.sleep(0)
    assert order == ["a"]
    assert not places.take_now(), "b and c wait for it"
    places.give_back()
    places.give_back()
    await asyncio.gather(*waiting)
    assert order == ["a", "b", "c"]
    places.give_back()
    assert places.take_now()


async def test_a_cancelled_taker_loses_no_place() -> None:
    """A taker cancelled while in line leaves it; one cancelled after a place was handed to
    it (before it ran) hands the place on."""
    places = Places(1)
    assert places.take_now()
    first = asyncio.create_task(places.take())
    second = asyncio.create_task(places.take())
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    places.give_back()  # to second: first left the line
    await second
    third = asyncio.create_task(places.take())
    await asyncio.sleep(0)
    places.give_back()  # handed to third, which is cancelled before it runs
    third.cancel()
    with pytest.raises(asyncio.CancelledError):
        await third
    assert places.take_now(), "third gave the place back"
    assert not places.take_now()


async def test_a_free_place_is_taken_without_waiting() -> None:
    places = Places(2)
    await asyncio.wait_for(places.take(), 1.0)
    assert places.take_now()
    assert not places.take_now()


async def test_a_load_has_at_most_load_calls_in_flight(make_store: MakeStore) -> None:
    """A worker of more sessions than LOAD_SETS x LOAD_CALLS sets loads in several waves of
    members.lua calls, and its mirror is whole: the next write lands beside every session."""
    worker = WorkerKey("pod-big", 0)
    sessions = LOAD_SETS * LOAD_CALLS + 100
    events: list[StoreEvent] = [
        EntriesStored([10 + i], "GPU", 0, f"s-{i}", None) for i in range(sessions)
    ]
    await (await make_store()).apply(worker, Batch(0, 10.0, events))
    after = await make_store()
    script = after._members_script
    now = most = 0

    async def members(**kwargs: Any) -> Any:
        nonlocal now, most
        now += 1
        most = max(most, now)
        try:
            return await script(**kwargs)
        finally:
            now -= 1

    after._members_script = members  # type: ignore[assignment]
    stored = EntriesStored([5], "GPU", 0, "s-0", None)
    assert await after.apply(worker, Batch(1, 11.0, [stored])) is ApplyOutcome.APPLIED
    assert most == LOAD_CALLS
    first, last = await after.get_session("s-0"), await after.get_session(f"s-{sessions - 1}")
    assert first is not None and [w.blocks for w in first.workers] == [2]
    assert last is not None and [w.blocks for w in last.workers] == [1]


@pytest.mark.cluster
async def test_a_place_comes_back_after_an_error_or_a_cancellation(
    redis_cluster: RedisClusterServers,
) -> None:
    """With one place: a command answered with an error, and one cancelled while Redis
    blocks on it, each give it back; the next command does not wait for it."""
    client = WaitingCluster.from_url(plain_url(redis_cluster), calls=1, wait=0.5)
    try:
        await client.set("a-string", "x")
        with pytest.raises(ResponseError):
            await client.lpush("a-string", "y")
        blocked = asyncio.create_task(client.blpop(["nothing-here"], timeout=2))
        await asyncio.sleep(0.1)
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        assert await client.get("a-string") == b"x"
    finally:
        await client.aclose()


@pytest.mark.cluster
async def test_a_call_that_got_no_place_is_closed_unrun(
    redis_cluster: RedisClusterServers,
) -> None:
    """A caller that waited past the wait gets ConnectionError, and its command was never
    sent nor left unawaited (no RuntimeWarning)."""
    client = WaitingCluster.from_url(plain_url(redis_cluster), calls=1, wait=0.1)
    try:
        blocked = asyncio.create_task(client.blpop(["nothing-here"], timeout=1))
        await asyncio.sleep(0.05)
        gc.collect()  # earlier tests' garbage first: only this call's warnings count
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            with pytest.raises(ConnectionError):
                await client.set("never", "1")
            gc.collect()
        assert await blocked is None
        assert await client.get("never") is None
    finally:
        await client.aclose()


@pytest.mark.cluster
async def test_the_readers_direct_path_gives_its_place_back_when_it_falls_back(
    redis_cluster: RedisClusterServers,
) -> None:
    """A round answered with an error reply leaves the commands to the client (None), and
    its place is free again for the next round."""
    client = WaitingCluster.from_url(plain_url(redis_cluster), calls=1, wait=0.5)
    reads = NodeReads(client)
    try:
        await client.rpush("a-list", "x")
        assert await reads.run([("a-list", ("GET", "a-list"), {})]) is None
        assert reads.fallbacks["WrongTypeError"] + reads.fallbacks["ResponseError"] == 1
        assert await reads.run([("a-list", ("LLEN", "a-list"), {})]) == [1]
    finally:
        await client.aclose()
