"""All publisher streams of this process, started and stopped together.

Imports zmq and the store contract; never the API. The streams share one ZMQ context (sized
for the fleet, see sockets.py), one store gate (one view of the store's availability), one
bound on concurrent replays and, where the store applies inline, one `Turns` (turns.py).
"""

from __future__ import annotations

import asyncio

import structlog
import zmq.asyncio

from kvsi.store.base import IndexStore
from kvsi.subscriber.gate import StoreGate
from kvsi.subscriber.sockets import StreamRoom, ingest_needs, room_for, sized_context
from kvsi.subscriber.stream import IngestOptions, PublisherSpec, WorkerStream
from kvsi.subscriber.turns import TURN_SECONDS, Turns

log = structlog.get_logger(__name__)


class StreamPool:
    """Runs one WorkerStream per publisher until stopped."""

    def __init__(
        self,
        specs: list[PublisherSpec],
        store: IndexStore,
        options: IngestOptions | None = None,
    ) -> None:
        options = options or IngestOptions()
        self._ctx, self.room = _sized(len(specs), options)
        self.gate = StoreGate(store, retry_max_seconds=options.store_retry_max)
        self.turns = Turns(TURN_SECONDS if store.applies_inline else None)
        """When the streams apply and replay (turns.py): in turns of the event loop where the
        store's apply holds it (the memory store's)."""
        # One bound for the process: a fleet that reconnects at once must not flood its
        # engines (and the store) with replays.
        self._options = options
        self._replays = asyncio.Semaphore(options.max_concurrent_replays)
        self.streams = [self._stream(spec) for spec in specs]
        self._tasks: dict[WorkerStream, asyncio.Task[None]] = {}

    def _stream(self, spec: PublisherSpec) -> WorkerStream:
        return WorkerStream(
            spec,
            self.gate,
            self._ctx,
            options=self._options,
            replay_limit=self._replays,
            room=self.room,
            turns=self.turns,
        )

    def _run(self, stream: WorkerStream) -> None:
        self._tasks[stream] = asyncio.create_task(stream.run(), name=f"stream:{stream.spec.pod}")

    async def start(self) -> None:
        for stream in self.streams:
            self._run(stream)

    async def add(self, spec: PublisherSpec) -> None:
        """Start a stream for one more publisher while the pool runs (central mode)."""
        stream = self._stream(spec)
        self.streams.append(stream)
        self._run(stream)

    async def remove(self, pod: str, dp_rank: int) -> bool:
        """Stop the stream of the publisher configured as (pod, dp_rank); False if none.
        Its index stays in the store: forgetting it is the caller's decision."""
        for stream in self.streams:
            if (stream.spec.pod, stream.spec.dp_rank) == (pod, dp_rank):
                self.streams.remove(stream)
                task = self._tasks.pop(stream, None)
                if task is not None:
                    await _cancelled(task)
                return True
        return False

    async def stop(self) -> None:
        await asyncio.gather(*(_cancelled(task) for task in self._tasks.values()))
        self._tasks = {}
        # destroy, not term: a socket a cancelled task did not get to close (an interrupt
        # landing mid-cleanup) would make term() wait forever; destroy closes them first.
        self._ctx.destroy(linger=0)

    def restatus(self) -> None:
        """Every stream stores its worker's status again (`WorkerStream.restatus`)."""
        for stream in self.streams:
            stream.restatus()

    def readiness_reasons(self) -> list[str]:
        """Why ingest keeps the service from being ready: store outage, buffering, repairs."""
        reasons = self.gate.reasons()
        for stream in self.streams:
            reasons.extend(stream.readiness_reasons())
        return reasons


async def _cancelled(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait for it to end."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _sized(configured: int, options: IngestOptions) -> tuple[zmq.asyncio.Context, StreamRoom]:
    """The streams' context and room, sized for `max_workers` or the configured publishers
    if more; one line says what fits, a warning if the configured publishers do not."""
    workers = max(configured, options.max_workers)
    replays = options.max_concurrent_replays
    sockets, files = ingest_needs(workers, replays)
    ctx, limits = sized_context(sockets, files)
    room = room_for(workers, limits, replays)
    fields = {
        "streams": room.capacity,
        "configured": configured,
        "zmq_max_sockets": limits.sockets,
        "file_limit": limits.files,
        "file_limit_hard": limits.files_hard,
        "files_wanted": files,
    }
    if configured > room.capacity:
        log.warning(
            "ingest.limits_too_low",
            detail=f"{configured} publishers configured, room for {room.capacity} streams: "
            f"the others stay degraded until a place frees up; {room.why}",
            **fields,
        )
    else:
        log.info("ingest.limits", **fields)
    return ctx, room
