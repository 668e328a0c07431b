"""The Redis store's change feed, read side: the workers' feed streams into this process's hub.

Imports neither zmq nor fastapi, nor the writer's mirror. Writers add one record per applied
batch (apply.lua) and per worker state change (status.lua) to the worker's stream
`P:{W}:feed`, in the same atomic call as the write itself: exactly once, in the worker's
order, whichever writer wrote. Every API replica runs one `FeedPump` (started by the first
`change_feed()`), which reads every registered worker's stream from where it was when the
pump started and delivers each record to the hub with the id
`<pod>/<rank>@<stream entry id>`: the same on every replica, so a client may resume on
another. Layout and choices: store/README.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec
import structlog
from redis.asyncio import Redis, RedisCluster

from kvsi.store.feed import FeedHub, FeedRecord
from kvsi.store.model import WorkerKey

log = structlog.get_logger(__name__)

POLL_SECONDS = 0.05
"""Pause between polling rounds that found nothing (cluster, or blocking reads off): how late
a record another process wrote reaches the hub, at most (plus a round trip). A record this
process wrote wakes the pump at once (`FeedPump.written`)."""

READ_COUNT = 500
"""Records read per stream per round; a full round is followed by another at once."""

WAKE_GAP_SECONDS = 0.002
"""Least time between two reads woken by this process's writes: the writes of a busy
process's streams in that time are read in one pipeline, not one each."""

BLOCK_MS = 250
"""XREAD BLOCK time on a standalone server (capped below the client's socket timeout): how
late a worker registered meanwhile starts being read, at most (plus the registry ttl)."""

BACKOFF_SECONDS = (0.1, 5.0)
"""First and longest pause after a failed round (Redis unreachable): doubles in between."""

START = "0-0"
"""Read position of a worker first seen after the pump started: its whole stream."""

_DECODER = msgspec.msgpack.Decoder(FeedRecord)


def record_id(worker: WorkerKey, entry_id: str) -> str:
    """The hub's id of a stream entry: the same on every replica reading that stream."""
    return f"{worker.pod}/{worker.dp_rank}@{entry_id}"


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


async def stream_ends(client: Redis | RedisCluster, keys: Sequence[str]) -> list[str]:
    """Each stream's last entry id ("0-0" for an empty or absent stream): one pipeline."""
    if not keys:
        return []
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.xrevrange(key, "+", "-", count=1)
    out = await pipe.execute()
    return [_text(entries[0][0]) if entries else START for entries in out]


class FeedPump:
    """Reads every registered worker's feed stream into `hub`, in each worker's order.

    Standalone server: one `XREAD BLOCK` over all streams (a record reaches the hub about a
    round trip after its write). Cluster: one pipeline of `XRANGE (last + COUNT n` per
    worker every POLL_SECONDS (redis-py splits it into one request per node; XREAD would
    cost it a COMMAND GETKEYS round trip per stream); and as soon as this process's own
    writer applied something (`written`: the ingest and the API in one process, as `kvsi
    serve` runs by default), one pipeline over just the workers it wrote, so their records
    reach the hub a round trip after the write instead of up to POLL_SECONDS later. A
    failed round is logged and retried with backoff from the same positions: nothing is
    skipped while the streams keep it.
    """

    def __init__(
        self,
        client: Redis | RedisCluster,
        hub: FeedHub,
        known: Callable[[], Awaitable[Sequence[WorkerKey]]],
        feed_key: Callable[[WorkerKey], str],
        positions: dict[WorkerKey, str],
    ) -> None:
        self._client = client
        self._hub = hub
        self._known = known
        self._feed_key = feed_key
        self._last = positions
        self._block_ms: int | None = None
        if isinstance(client, Redis):
            timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
            block = BLOCK_MS if timeout is None else min(BLOCK_MS, int(timeout * 500))
            self._block_ms = block if block >= 10 else None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._dirty: set[WorkerKey] = set()
        """Workers this process wrote since the pump last read them (cluster only)."""
        self._waiting = False
        """Whether the pump waits for a write of this process or the next poll."""
        self.delivered = 0

    def written(self, worker: WorkerKey) -> None:
        """This process wrote the worker's stream: read it now, not at the next poll."""
        if self._block_ms is None:
            self._dirty.add(worker)
            self._wake.set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="kvsi-feed-pump")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                more = await self._round()
                if not more and self._block_ms is None:
                    await self._until_due()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                pause = min(BACKOFF_SECONDS[0] * 2 ** (failures - 1), BACKOFF_SECONDS[1])
                if failures == 1:
                    log.warning(
                        "feed.read_failed",
                        error=f"{type(exc).__name__}: {exc}",
                        then="reading the worker streams again, with backoff",
                    )
                await asyncio.sleep(pause)
                continue
            if failures:
                log.info("feed.read_again", failed_rounds=failures)
                failures = 0

    async def _until_due(self) -> None:
        """Wait POLL_SECONDS, or until this process wrote a stream; then read what it wrote
        (as often as writes come, one pipeline each) until the next full round is due, or
        one of those streams may have more than one read returns."""
        due = asyncio.get_running_loop().time() + POLL_SECONDS
        wake = self._wake
        while True:
            left = due - asyncio.get_running_loop().time()
            if left <= 0:
                return
            if not wake.is_set():
                self._waiting = True
                try:
                    async with asyncio.timeout(left):
                        await wake.wait()
                except TimeoutError:
                    return
                finally:
                    self._waiting = False
            wake.clear()
            dirty, self._dirty = self._dirty, set()
            workers = [w for w in dirty if w in self._last]
            if workers:
                if await self._read(workers):
                    return
                await asyncio.sleep(WAKE_GAP_SECONDS)

    async def _workers(self) -> Sequence[WorkerKey]:
        workers = await self._known()
        last = self._last
        current = set(workers)
        for gone in [w for w in last if w not in current]:
            del last[gone]
        for w in workers:
            last.setdefault(w, START)
        return workers

    async def _round(self) -> bool:
        """One read of every stream; True if some stream may have more right away."""
        workers = await self._workers()
        if not workers:
            await asyncio.sleep(POLL_SECONDS)
            return False
        if self._block_ms is not None:
            return await self._read_blocking(workers, self._block_ms)
        self._dirty.clear()
        return await self._read(workers)

    async def _read(self, workers: Sequence[WorkerKey]) -> bool:
        """One pipeline of XRANGE after each worker's position; True if one may have more."""
        pipe = self._client.pipeline(transaction=False)
        for w in workers:
            pipe.xrange(self._feed_key(w), f"({self._last[w]}", "+", count=READ_COUNT)
        more = False
        for w, entries in zip(workers, await pipe.execute(), strict=True):
            self._deliver(w, entries)
            more = more or len(entries) >= READ_COUNT
        return more

    async def _read_blocking(self, workers: Sequence[WorkerKey], block_ms: int) -> bool:
        by_key = {self._feed_key(w): w for w in workers}
        streams: dict[Any, Any] = {key: self._last[w] for key, w in by_key.items()}
        reply = await self._client.xread(streams, count=READ_COUNT, block=block_ms)
        if not reply:
            return False
        items = reply.items() if isinstance(reply, dict) else reply
        more = False
        for key, entries in items:
            w = by_key.get(_text(key))
            if w is not None and w in self._last:
                self._deliver(w, entries)
                more = more or len(entries) >= READ_COUNT
        return more

    def _deliver(self, worker: WorkerKey, entries: list[Any]) -> None:
        for raw_id, fields in entries:
            entry_id = _text(raw_id)
            payload = fields.get(b"r", fields.get("r"))
            self._last[worker] = entry_id
            try:
                record = _DECODER.decode(payload)
            except (msgspec.DecodeError, TypeError):
                log.error("feed.unreadable_record", entry=entry_id, worker=str(worker))
                continue
            self._hub.deliver(record_id(worker, entry_id), record)
            self.delivered += 1
