"""One publisher's ordered stream: frames in, seq tracked per worker, batches applied.

Imports zmq and the store contract; never the API. The SUB socket reconnects by itself when
a publisher goes away and comes back; a socket monitor makes that visible as worker status.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import structlog
import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from kvsi import metrics
from store.base import IndexStore
from store.model import (
    ApplyOutcome,
    Batch,
    BlocksRemoved,
    BlocksStored,
    StoreEvent,
    WorkerKey,
    WorkerState,
)
from store.model import WorkerStatus as Status
from subscriber.decode import Decoded, ingest_decoder
from subscriber.drops import DropReason

log = structlog.get_logger(__name__)

SEQ_BYTES = 8


@dataclass(frozen=True)
class PublisherSpec:
    """Where one vLLM publisher (one pod, one DP rank) listens."""

    pod: str
    endpoint: str
    replay_endpoint: str | None = None
    dp_rank: int = 0
    """Rank assumed until a batch names its own `data_parallel_rank`."""
    topic: str = ""
    """ZMQ prefix filter; vLLM's topic is often `kv@<pod>@<model>`."""


@dataclass
class _WorkerSeq:
    last_seq: int | None = None
    gaps: int = 0
    missed: int = 0


@dataclass
class StreamStats:
    """Counters a test or `tail` can read without scraping Prometheus."""

    messages: int = 0
    drops: dict[DropReason, int] = field(default_factory=dict)
    outcomes: dict[ApplyOutcome, int] = field(default_factory=dict)


class WorkerStream:
    """Subscribes to one publisher and applies its batches to the store in seq order."""

    def __init__(self, spec: PublisherSpec, store: IndexStore, ctx: zmq.asyncio.Context) -> None:
        self.spec = spec
        self._store = store
        self._ctx = ctx
        self._decoder = ingest_decoder()
        self._seqs: dict[WorkerKey, _WorkerSeq] = {}
        self.stats = StreamStats()

    @property
    def default_worker(self) -> WorkerKey:
        return WorkerKey(self.spec.pod, self.spec.dp_rank)

    async def run(self) -> None:
        """Receive until cancelled; never raises for bad input."""
        sock = self._ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.spec.topic.encode())
        monitor = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        watcher = asyncio.create_task(self._watch_connection(monitor))
        await self._store.set_status(
            self.default_worker, Status(WorkerState.CONNECTING, time.time())
        )
        sock.connect(self.spec.endpoint)
        log.info("stream.connect", pod=self.spec.pod, endpoint=self.spec.endpoint)
        try:
            while True:
                frames = await sock.recv_multipart()
                await self.on_message(frames)
        finally:
            watcher.cancel()
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)

    async def on_message(self, frames: list[bytes]) -> None:
        """Handle one live message `[topic, seq, payload]`."""
        self.stats.messages += 1
        if len(frames) != 3:
            self._drop(DropReason.FRAME_COUNT, frames=len(frames))
            return
        _, seq_frame, payload = frames
        if len(seq_frame) != SEQ_BYTES:
            self._drop(DropReason.SEQ_FRAME, length=len(seq_frame))
            return
        seq = int.from_bytes(seq_frame, "big")
        decoded = self._decoder.decode(payload)
        for reason in decoded.dropped:
            self._drop(reason, seq=seq)
        worker = self._worker_of(decoded)
        self._track(worker, seq)
        if decoded.ok:
            await self._apply(worker, Batch(seq, decoded.ts, decoded.events))

    def _worker_of(self, decoded: Decoded[StoreEvent]) -> WorkerKey:
        rank = decoded.data_parallel_rank
        return self.default_worker if rank is None else WorkerKey(self.spec.pod, rank)

    def _track(self, worker: WorkerKey, seq: int) -> None:
        state = self._seqs.setdefault(worker, _WorkerSeq())
        last = state.last_seq
        if last is not None and seq > last + 1:
            state.gaps += 1
            state.missed += seq - last - 1
            metrics.GAPS.labels(str(worker)).inc()
            metrics.BATCHES_MISSED.labels(str(worker)).inc(seq - last - 1)
            log.warning("stream.gap", worker=str(worker), expected=last + 1, got=seq)
        state.last_seq = seq
        metrics.LAST_SEQ.labels(str(worker)).set(seq)

    async def _apply(self, worker: WorkerKey, batch: Batch) -> None:
        started = time.perf_counter()
        outcome = await self._store.apply(worker, batch)
        metrics.APPLY_SECONDS.observe(time.perf_counter() - started)
        self.stats.outcomes[outcome] = self.stats.outcomes.get(outcome, 0) + 1
        metrics.BATCHES.labels(str(worker), outcome.value).inc()
        if outcome is ApplyOutcome.APPLIED or outcome is ApplyOutcome.RESTARTED:
            metrics.BLOCK_EVENTS.labels(str(worker)).inc(_block_events(batch))
        if outcome is ApplyOutcome.RESTARTED:
            log.warning("stream.engine_restart", worker=str(worker), seq=batch.seq)

    def _drop(self, reason: DropReason, **context: object) -> None:
        self.stats.drops[reason] = self.stats.drops.get(reason, 0) + 1
        metrics.DROPS.labels(self.spec.pod, reason.value).inc()
        log.warning("stream.drop", pod=self.spec.pod, reason=reason.value, **context)

    async def _watch_connection(self, monitor: zmq.asyncio.Socket) -> None:
        """Publish socket connects and disconnects as worker status."""
        while True:
            event = await recv_monitor_message(monitor)
            connected = event["event"] == zmq.EVENT_CONNECTED
            metrics.CONNECTED.labels(self.spec.pod).set(1 if connected else 0)
            state = WorkerState.LIVE if connected else WorkerState.DISCONNECTED
            for worker in self._seqs or [self.default_worker]:
                await self._store.set_status(worker, Status(state, time.time()))
            log.info("stream.connection", pod=self.spec.pod, state=state.value)


def _block_events(batch: Batch) -> int:
    return sum(
        len(e.block_hashes) for e in batch.events if isinstance(e, BlocksStored | BlocksRemoved)
    )
