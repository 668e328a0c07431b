"""A splitting central replica fences the statuses it stores with its view's roster epoch:
while two replicas briefly follow one pod, the one about to release it (its view older)
cannot write its status ("connecting") over the new owner's ("live"). Against a real
redis-server's roster; the store's side of the fence is tests/conformance/test_store.py's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial

import pytest

from kvsi.discovery import (
    Changes,
    PodEvent,
    PodInfo,
    PodSnapshot,
    apply_changes,
    run_discovery,
)
from kvsi.ownership import owner
from kvsi.settings import DiscoveryConfig
from kvsi.store.memory import MemoryStore
from kvsi.store.model import WorkerKey, WorkerState, WorkerStatus
from kvsi.store.redis.layout import DEFAULT_PREFIX, roster_key
from kvsi.store.redis.roster import RedisRoster, epoch_key
from kvsi.store.select import open_store
from kvsi.subscriber.pool import StreamPool
from kvsi.subscriber.stream import IngestOptions, PublisherSpec
from tests.ports import free_port
from tests.redis_servers import RedisServer, require
from tests.subscriber.stores import RecordingStore
from tests.waiting import until

pytestmark = pytest.mark.redis

BEAT = 0.05
CONFIG = DiscoveryConfig(labels={"app": "vllm"}, split=True, replica_id="me", beat_seconds=BEAT)


async def no_pods() -> AsyncIterator[PodSnapshot | PodEvent]:
    await asyncio.Event().wait()
    yield PodSnapshot(pods=())  # never reached: the watch stays quiet


async def test_the_statuses_carry_the_rosters_epoch_after_every_beat() -> None:
    """The gate's epoch is the roster's after each beat: after the first view, after another
    replica joined (a new view), and after the epoch moved with the same live set (a replica
    joined and left between two beats: it may have written statuses at its epochs)."""
    require("redis-server")
    server = RedisServer()
    server.start()
    roster, other = RedisRoster.from_url(server.url), RedisRoster.from_url(server.url)
    pool = StreamPool([], MemoryStore())
    loop = asyncio.create_task(run_discovery(CONFIG, pool, no_pods(), roster=roster))

    async def fenced_at_least(epoch: int) -> int | None:
        now = pool.gate.status_epoch
        return now if now is not None and now >= epoch else None

    try:
        first = await until(partial(fenced_at_least, 0), 30, "a fence after the first view")
        joined = await other.beat("other", 600)
        assert joined.epoch > first
        assert await until(partial(fenced_at_least, joined.epoch), 30, "the join's epoch")
        await until(partial(fenced_at_least, joined.epoch), 30, "the join seen")
        # As if a replica joined and left between two beats: the set as before, a newer epoch.
        moved = joined.epoch + 1_000
        with server.client() as raw:
            raw.set(epoch_key(roster_key(DEFAULT_PREFIX)), moved)
        assert await until(partial(fenced_at_least, moved), 10, "the newer epoch, same view")
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await pool.stop()
        await other.close()
        server.remove()


class Calls(StreamPool):
    """A pool with no streams that notes the gate's epoch at each release and start."""

    def __init__(self) -> None:
        super().__init__([], MemoryStore())
        self.seen: list[tuple[str, int | None]] = []

    async def add(self, spec: PublisherSpec) -> None:
        self.seen.append((f"start {spec.pod}", self.gate.status_epoch))

    async def remove(self, pod: str, dp_rank: int) -> bool:
        self.seen.append((f"stop {pod}", self.gate.status_epoch))
        return False


async def test_a_new_epoch_fences_the_streams_started_not_those_released() -> None:
    """A stream released on a new view may still write its status as it stops: at the old
    epoch, which the new owner's refuses. The streams the view starts write at the new one."""
    pool = Calls()
    pool.gate.status_epoch = 7
    changes = Changes(
        start=(PublisherSpec("pod-new", "tcp://127.0.0.1:1"),),
        release=(WorkerKey("pod-gone", 0),),
    )
    await apply_changes(changes, pool, CONFIG, 8)
    assert pool.seen == [("stop pod-gone", 7), ("start pod-new", 8)]
    assert pool.gate.status_epoch == 8


class HeldStatuses(MemoryStore):
    """A memory store whose status writes never complete (a write in flight to a store that
    does not answer): each call is noted with its epoch, and whether it was cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[WorkerKey, int | None]] = []
        self.pending = 0

    async def set_status(
        self, worker: WorkerKey, status: WorkerStatus, epoch: int | None = None
    ) -> bool:
        self.calls.append((worker, epoch))
        self.pending += 1
        try:
            await asyncio.Event().wait()
        finally:
            self.pending -= 1
        return True


async def test_a_released_stream_writes_no_status_at_the_new_epoch() -> None:
    """The stream released on a new view is stopped, its status write in flight cancelled,
    before the gate takes the view's epoch: every status it ever asked for carries the old
    epoch, and none is left waiting to be retried at the new one."""
    store = HeldStatuses()
    spec = PublisherSpec("pod-gone", f"tcp://127.0.0.1:{free_port()}")
    pool = StreamPool([spec], store)
    pool.gate.status_epoch = 7
    await pool.start()

    async def writing() -> bool | None:
        return store.pending == 1 or None

    try:
        await until(writing, 10, "the stream's first status write")
        await apply_changes(Changes(release=(WorkerKey("pod-gone", 0),)), pool, CONFIG, 8)
        assert pool.gate.status_epoch == 8
        assert store.pending == 0
        await asyncio.sleep(0.2)
        assert store.calls and all(epoch == 7 for _, epoch in store.calls)
        assert store.pending == 0
    finally:
        await pool.stop()


async def test_a_kept_workers_status_is_stored_again_on_a_new_epoch() -> None:
    """Replica C joins, owns p0, stores p0's status at its epoch and leaves, all between two
    of A's beats: A never released p0, and on the new epoch its stream stores p0's status
    again over C's (with the index audit far off, nothing else would)."""
    require("redis-server")
    server = RedisServer()
    server.start()
    store = open_store(server.url)
    roster_a, roster_c = RedisRoster.from_url(server.url), RedisRoster.from_url(server.url)
    c = next(f"c{i}" for i in range(1000) if owner("p0", ["a", f"c{i}"]) == f"c{i}")
    config = DiscoveryConfig(
        labels={"app": "vllm"},
        split=True,
        replica_id="a",
        beat_seconds=2.0,
        replica_ttl_seconds=10.0,
        replay_port=None,
        events_port=free_port(),
    )
    pool = StreamPool([], store, IngestOptions(index_audit=600.0))

    async def pods() -> AsyncIterator[PodSnapshot | PodEvent]:
        yield PodSnapshot(pods=(PodInfo("p0", "127.0.0.1", True),))
        await asyncio.Event().wait()

    loop = asyncio.create_task(run_discovery(config, pool, pods(), roster=roster_a))

    async def status_of_p0() -> WorkerStatus | None:
        found = [w.status for w in await store.list_workers() if (w.pod, w.dp_rank) == ("p0", 0)]
        return found[0] if found else None

    try:
        await until(status_of_p0, 10, "A's first status of p0")
        first = pool.gate.status_epoch
        assert first is not None
        joined = await roster_c.beat(c, 30)
        assert joined.epoch > first and owner("p0", joined.live) == c
        theirs = WorkerStatus(WorkerState.DEGRADED, 1.0, f"written by {c}")
        assert await store.set_status(WorkerKey("p0", 0), theirs, joined.epoch)
        await roster_c.leave(c)

        async def mine_again() -> WorkerStatus | None:
            now = await status_of_p0()
            return now if now is not None and now.detail != theirs.detail else None

        await until(mine_again, 3 * config.beat_seconds, "A's status of p0 stored again")
        assert pool.gate.status_epoch is not None and pool.gate.status_epoch > joined.epoch
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await pool.stop()
        await roster_a.close()
        await roster_c.close()
        await store.close()
        server.remove()


class FailingStatuses(RecordingStore):
    """A store whose status writes fail while `failing` (every other call answers, so the
    gate retries the status alone); each attempt is noted with its epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = True
        self.attempts: list[tuple[WorkerKey, int | None]] = []

    async def set_status(
        self, worker: WorkerKey, status: WorkerStatus, epoch: int | None = None
    ) -> bool:
        self.attempts.append((worker, epoch))
        if self.failing:
            raise ConnectionError("status writes fail (test)")
        return await super().set_status(worker, status, epoch)


async def test_a_released_streams_status_retried_through_an_outage_keeps_the_old_epoch() -> None:
    """The gate reads the epoch again at each retry of a status write: a stream released
    while retrying must be gone before the gate takes the new epoch, or its retry would
    store its status at it."""
    store = FailingStatuses()
    gone = WorkerKey("pod-gone", 0)
    pool = StreamPool([PublisherSpec("pod-gone", f"tcp://127.0.0.1:{free_port()}")], store)
    pool.gate.status_epoch = 7
    await pool.start()

    async def retrying() -> bool | None:
        return sum(1 for w, _ in store.attempts if w == gone) >= 2 or None

    try:
        await until(retrying, 10, "the stream's status write retried")
        await apply_changes(Changes(release=(gone,)), pool, CONFIG, 8)
        store.failing = False
        await asyncio.sleep(0.5)  # several of the gate's retry pauses
        assert all(epoch == 7 for w, epoch in store.attempts if w == gone), store.attempts
    finally:
        await pool.stop()
