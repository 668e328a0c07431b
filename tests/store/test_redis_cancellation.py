"""A task cancelled while it talks to Redis ends cancelled (store/redis/transport.py's
`keep_cancellations`): on Python 3.11 redis-py's commands went through an `asyncio.wait_for`
that returned the reply instead, and a stream told to stop on a Redis store kept running.

Real redis-server, real ZMQ: the cancels land at random loop turns of commands in flight.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from redis.asyncio import Redis

from kvsi.simulator.fleet import SimulatedFleet
from kvsi.store.redis.transport import keep_cancellations
from kvsi.subscriber.pool import StreamPool
from kvsi.subscriber.stream import PublisherSpec
from tests.redis_servers import RedisServer
from tests.store.conftest import MakeStore

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

CANCELS = 300


async def _commands(client: Redis) -> None:
    """SADD after SADD; raises if a cancellation was swallowed by the one before."""
    while True:
        await client.sadd("cancellation-test", "m")
        if asyncio.current_task().cancelling():  # type: ignore[union-attr]
            raise AssertionError("the command returned to a cancelled task")


async def test_a_task_cancelled_mid_command_ends_cancelled(redis_server: RedisServer) -> None:
    keep_cancellations()
    client = Redis.from_url(redis_server.url, socket_timeout=5)
    rng = random.Random(7)
    outcomes: dict[str, int] = {}
    try:
        for _ in range(CANCELS):
            task = asyncio.create_task(_commands(client))
            for _ in range(rng.randrange(1, 8)):
                await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=10)
            assert done, "a cancelled task did not end"
            kind = "cancelled" if task.cancelled() else type(task.exception()).__name__
            outcomes[kind] = outcomes.get(kind, 0) + 1
    finally:
        await client.aclose()
    assert outcomes == {"cancelled": CANCELS}


async def test_streams_on_redis_stop_at_one_cancel(make_store: MakeStore) -> None:
    """Streams added to and removed from two pools over one Redis store while their pods
    publish: every removal (one cancel, see subscriber/pool.py) ends its stream."""
    stores = [await make_store(), await make_store()]
    pools = [StreamPool([], store) for store in stores]
    rng = random.Random(1)
    async with SimulatedFleet(pods=4, sessions=24, seed=3, num_blocks=256) as fleet:
        traffic = fleet.run_in_background(40.0)
        specs = [PublisherSpec(pod, pub, replay) for pod, pub, replay in fleet.endpoints()]
        owner: dict[str, StreamPool] = {}
        try:
            for _ in range(120):
                spec = rng.choice(specs)
                pool = owner.pop(spec.pod, None)
                if pool is None:
                    owner[spec.pod] = pool = rng.choice(pools)
                    await pool.add(spec)
                else:
                    async with asyncio.timeout(10):
                        assert await pool.remove(spec.pod, spec.dp_rank)
                await asyncio.sleep(rng.uniform(0, 0.15))
        finally:
            fleet.stop()
            await traffic
            for pool in pools:
                async with asyncio.timeout(10):
                    await pool.stop()
