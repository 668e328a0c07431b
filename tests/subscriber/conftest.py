"""Fixtures of the subscriber tests: a private zmq context, and a rig factory (a bare
publisher, its replay ROUTER, a recording store and one WorkerStream), all cleaned up."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack

import pytest
import zmq.asyncio

from kvsi.store.model import WorkerKey, WorkerState, WorkerView
from kvsi.subscriber.gate import StoreGate
from kvsi.subscriber.stream import IngestOptions, PublisherSpec, WorkerStream
from tests.subscriber.peers import Publisher, ReplayRouter, running, tcp
from tests.subscriber.stores import RecordingStore
from tests.waiting import eventually

FAST = IngestOptions(replay_timeout=0.5, replay_attempts=2, unconfirmed_ttl=60.0)
"""Options for tests: failures show within a second, the stale policy only when asked."""


class Rig:
    """One publisher (PUB + replay ROUTER), one store, one stream: the parts a test drives."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        *,
        replay: bool,
        legacy: bool,
        options: IngestOptions,
        store: RecordingStore | None,
        dp_rank: int,
    ) -> None:
        self.ctx = ctx
        self.publisher = Publisher(ctx, tcp())
        self.router: ReplayRouter | None = None
        if replay:
            self.router = ReplayRouter(ctx, tcp(), self.publisher, legacy=legacy)
            self.router.start()
        self.store = store or RecordingStore()
        self.options = options
        self.spec = PublisherSpec(
            "pod-a",
            self.publisher.sock.getsockopt_string(zmq.LAST_ENDPOINT),
            self.router.endpoint if self.router else None,
            dp_rank=dp_rank,
        )
        self.stream = self.new_stream()

    def new_stream(self) -> WorkerStream:
        """A stream as a restarted sidecar would build it (same store, fresh state)."""
        return WorkerStream(self.spec, StoreGate(self.store), self.ctx, options=self.options)

    @property
    def worker(self) -> WorkerKey:
        return self.stream.worker

    async def view(self) -> WorkerView:
        views = {WorkerKey(w.pod, w.dp_rank): w for w in await self.store.inner.list_workers()}
        return views[self.stream.worker]

    async def applied_through(self, seq: int) -> None:
        """Wait until the stream's worker has applied `seq` (by its fence)."""

        async def done() -> bool:
            fence = await self.store.inner.fence(self.stream.worker)
            return fence is not None and fence.seq >= seq

        await eventually(done)

    async def state(self, state: WorkerState) -> None:
        async def reached() -> bool:
            return (await self.view()).status.state is state

        await eventually(reached)

    async def close(self) -> None:
        if self.router is not None:
            await self.router.close()
        self.publisher.close()


RigFactory = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    context = zmq.asyncio.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


@pytest.fixture
async def rig(ctx: zmq.asyncio.Context) -> AsyncIterator[RigFactory]:
    """`await rig(replay=True, legacy=False, options=FAST, start=True)`: a running rig."""
    async with AsyncExitStack() as stack:

        async def make(
            *,
            replay: bool = True,
            legacy: bool = False,
            options: IngestOptions = FAST,
            store: RecordingStore | None = None,
            dp_rank: int = 0,
            start: bool = True,
        ) -> Rig:
            made = Rig(
                ctx, replay=replay, legacy=legacy, options=options, store=store, dp_rank=dp_rank
            )
            stack.push_async_callback(made.close)
            if start:
                await stack.enter_async_context(running(made.stream))
                await made.publisher.probe(made.stream)
            return made

        yield make
