"""A splitting central replica has its streams store their workers' statuses again two beats
after its view of the replicas changed (`discovery.HANDOVER_BEATS`): while two replicas
briefly follow one pod, the one about to release it can write its status ("connecting")
over the owner's ("live"), and nothing else would write it again until the next audit.
Against a real redis-server's roster."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from functools import partial

import pytest

from kvsi.discovery import HANDOVER_BEATS, PodEvent, PodSnapshot, run_discovery
from kvsi.settings import DiscoveryConfig
from kvsi.store.memory import MemoryStore
from kvsi.store.redis.roster import RedisRoster
from kvsi.subscriber.pool import StreamPool
from tests.redis_servers import RedisServer, require
from tests.waiting import until

pytestmark = pytest.mark.redis

BEAT = 0.05


class RestatusLog(StreamPool):
    """A pool with no streams that notes when it was asked to store the statuses again."""

    def __init__(self) -> None:
        super().__init__([], MemoryStore())
        self.restatused: list[float] = []

    def restatus(self) -> None:
        self.restatused.append(time.monotonic())
        super().restatus()


async def no_pods() -> AsyncIterator[PodSnapshot | PodEvent]:
    await asyncio.Event().wait()
    yield PodSnapshot(pods=())  # never reached: the watch stays quiet


async def test_statuses_are_stored_again_two_beats_after_the_view_changes() -> None:
    require("redis-server")
    server = RedisServer()
    server.start()
    roster, other = RedisRoster.from_url(server.url), RedisRoster.from_url(server.url)
    pool = RestatusLog()
    config = DiscoveryConfig(labels={"app": "vllm"}, split=True, replica_id="me", beat_seconds=BEAT)
    loop = asyncio.create_task(run_discovery(config, pool, no_pods(), roster=roster))

    async def restatused(times: int) -> bool:
        return len(pool.restatused) >= times

    try:
        await until(partial(restatused, 1), 30, "a restatus after the first view")
        joined = time.monotonic()
        await other.beat("other", 30)
        await until(partial(restatused, 2), 30, "a restatus after the other joined")
        assert pool.restatused[1] - joined >= (HANDOVER_BEATS - 1) * BEAT
        await asyncio.sleep(10 * BEAT)
        assert len(pool.restatused) == 2, "no view change, no restatus"
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await pool.stop()
        await other.close()
        await roster.close()
        server.remove()
