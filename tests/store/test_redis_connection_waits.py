"""A Redis store counts the calls that waited for a connection (a place, on a cluster) and
their seconds, and not those that got one at once: the standalone client's `CountingPool`
(store/redis/pool.py), the cluster's `WaitingCluster` (store/redis/cluster_client.py), read
through `RedisStore.connection_waits`."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from redis.asyncio import Redis

from kvsi.store.base import ConnectionWaits, PooledStore
from kvsi.store.redis import RedisStore
from kvsi.store.redis.cluster_client import WaitingCluster
from kvsi.store.redis.pool import CountingPool
from kvsi.store.redis.reads import HELD_CONNECTIONS
from kvsi.store.redis.store import open_client
from tests.redis_servers import RedisServer

CALLERS = 64
"""Commands sent at once."""

OpenStore = Callable[[int], RedisStore]


@pytest.fixture(params=["redis", pytest.param("cluster", marks=pytest.mark.cluster)])
async def open_store(request: pytest.FixtureRequest) -> AsyncIterator[OpenStore]:
    """Stores on the standalone server, then on the cluster, with `calls` connections (on
    the cluster, calls in flight): the URL's `max_connections`; closed after."""
    name = "redis_server" if request.param == "redis" else "redis_cluster"
    url: str = request.getfixturevalue(name).url
    made: list[RedisStore] = []

    def make(calls: int) -> RedisStore:
        client, _ = open_client(f"{url}?max_connections={calls}")
        if isinstance(client, WaitingCluster):
            assert client.calls == calls
        else:
            assert isinstance(client, Redis)
            pool = client.connection_pool
            assert isinstance(pool, CountingPool) and pool.max_connections == calls
        made.append(RedisStore(client))
        return made[-1]

    yield make
    for store in made:
        await store.close()


async def commands_at_once(store: RedisStore, rounds: int = 2) -> None:
    """CALLERS GETs at once, `rounds` times, every one answered."""
    client = store._client
    for _ in range(rounds):
        keys = [f"waits-{i}" for i in range(CALLERS)]
        assert await asyncio.gather(*(client.get(k) for k in keys)) == [None] * CALLERS


async def test_calls_past_the_pool_are_counted_with_their_seconds(open_store: OpenStore) -> None:
    """64 commands at once, twice, on a client of 2 connections: every caller past the 2
    waits (all 64 ask before any is answered), and the store says so."""
    store = open_store(2)
    assert isinstance(store, PooledStore)
    assert store.connection_waits() == ConnectionWaits(0, 0.0)

    await commands_at_once(store)

    waits = store.connection_waits()
    assert waits.waits == 2 * (CALLERS - 2)
    assert waits.seconds > 0


async def test_calls_within_the_pool_are_not_counted(open_store: OpenStore) -> None:
    """64 commands at once on a client of 64 connections: none waits."""
    store = open_store(CALLERS)

    await commands_at_once(store)

    assert store.connection_waits() == ConnectionWaits(0, 0.0)


@pytest.mark.parametrize(("pool", "held"), [(2, 0), (3, 1), (5, 2), (64, HELD_CONNECTIONS)])
async def test_the_read_scripts_hold_at_most_half_the_pool_less_one(
    redis_server: RedisServer, pool: int, held: int
) -> None:
    """On a standalone server the session lookups keep connections of the pool for their
    script calls: at most half of it less one (the change feed's), up to HELD_CONNECTIONS.
    A registry read then still finds one free, where a pool held whole by them made it wait
    POOL_WAIT seconds and fail."""
    prefix = f"t-{uuid.uuid4().hex[:12]}"
    store = RedisStore.from_url(f"{redis_server.url}?max_connections={pool}&prefix={prefix}")
    try:
        sessions = await asyncio.gather(*(store.get_session(f"s-{i}") for i in range(8)))
        assert sessions == [None] * 8
        assert store._reads is not None and store._reads._held == held

        assert await asyncio.wait_for(store.list_workers(), 2) == []
    finally:
        await store.close()


async def test_a_caller_behind_the_pools_lock_is_counted(redis_server: RedisServer) -> None:
    """A connection is free but the pool's lock is held (as by a release closing a
    connection): the caller waits for the lock, and that wait is counted too."""
    pool = CountingPool.from_url(redis_server.url, max_connections=4)
    try:
        async with pool._condition:
            waiter = asyncio.ensure_future(pool.get_connection())
            await asyncio.sleep(0.05)
            assert not waiter.done()
        await pool.release(await waiter)

        waits = pool.waited.read()
        assert waits.waits == 1
        assert waits.seconds >= 0.04
    finally:
        await pool.aclose()
