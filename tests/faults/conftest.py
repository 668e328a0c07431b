"""Fixtures of the fault suite: a zmq context per test, fleets and sidecars that always stop.

Every fleet runs on loopback tcp with free ports; everything a test starts is closed after
it, failed or not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest
import zmq.asyncio

from kvsi.simulator.fleet import SimulatedFleet
from kvsi.store.base import IndexStore
from kvsi.subscriber.stream import IngestOptions
from tests.faults.harness import FAULTS, Sidecar


class Parts:
    """Starts fleets and sidecars for one test and stops them all when it ends."""

    def __init__(self, ctx: zmq.asyncio.Context, stack: AsyncExitStack) -> None:
        self.ctx = ctx
        self._stack = stack

    async def fleet(self, **kwargs: Any) -> SimulatedFleet:
        """A started fleet (2 pods, 512-block engines unless told otherwise)."""
        options: dict[str, Any] = {"pods": 2, "sessions": 12, "seed": 7, "num_blocks": 512}
        fleet = SimulatedFleet(**(options | kwargs), context=self.ctx)
        await fleet.start()
        self._stack.push_async_callback(fleet.close)
        return fleet

    async def sidecar(
        self, store: IndexStore, fleet: SimulatedFleet, options: IngestOptions = FAULTS
    ) -> Sidecar:
        """A running sidecar on `fleet`; `stop()` it to simulate a sidecar going away."""
        sidecar = Sidecar.for_fleet(store, fleet, options)
        await sidecar.start()
        self._stack.push_async_callback(_stop_once(sidecar))
        return sidecar


def _stop_once(sidecar: Sidecar) -> Callable[[], Any]:
    async def stop() -> None:
        if not sidecar.client.is_closed:
            await sidecar.stop()

    return stop


@pytest.fixture
async def parts() -> AsyncIterator[Parts]:
    ctx = zmq.asyncio.Context()
    try:
        async with AsyncExitStack() as stack:
            yield Parts(ctx, stack)
    finally:
        ctx.destroy(linger=0)
