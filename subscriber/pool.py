"""All publisher streams of this process, started and stopped together.

Imports zmq and the store contract; never the API.
"""

from __future__ import annotations

import asyncio

import zmq.asyncio

from store.base import IndexStore
from subscriber.stream import PublisherSpec, WorkerStream


class StreamPool:
    """Runs one WorkerStream per publisher until stopped."""

    def __init__(self, specs: list[PublisherSpec], store: IndexStore) -> None:
        self._ctx = zmq.asyncio.Context()
        self.streams = [WorkerStream(spec, store, self._ctx) for spec in specs]
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
