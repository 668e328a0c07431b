"""All publisher streams of this process, started and stopped together.

Imports zmq and the store contract; never the API. The streams share one ZMQ context, one
store gate (one view of the store's availability) and one bound on concurrent replays.
"""

from __future__ import annotations

import asyncio

import zmq.asyncio

from store.base import IndexStore
from subscriber.gate import StoreGate
from subscriber.stream import IngestOptions, PublisherSpec, WorkerStream


class StreamPool:
    """Runs one WorkerStream per publisher until stopped."""

    def __init__(
        self,
        specs: list[PublisherSpec],
        store: IndexStore,
        options: IngestOptions | None = None,
    ) -> None:
        options = options or IngestOptions()
        self._ctx = zmq.asyncio.Context()
        self.gate = StoreGate(store, retry_max_seconds=options.store_retry_max)
        # One bound for the process: a fleet that reconnects at once must not flood its
        # engines (and the store) with replays.
        replays = asyncio.Semaphore(options.max_concurrent_replays)
        self.streams = [
            WorkerStream(spec, self.gate, self._ctx, options=options, replay_limit=replays)
            for spec in specs
        ]
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(s.run(), name=f"stream:{s.spec.pod}") for s in self.streams
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._ctx.term()

    def readiness_reasons(self) -> list[str]:
        """Why ingest keeps the service from being ready: store outage, buffering, repairs."""
        reasons = self.gate.reasons()
        for stream in self.streams:
            reasons.extend(stream.readiness_reasons())
        return reasons
