"""Ingest a simulated vLLM 0.33 fleet end to end; the API must equal the engines' truth."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from kvsi.api.app import create_app
from kvsi.simulator.fleet import SimulatedFleet
from kvsi.store.memory import MemoryStore
from kvsi.subscriber.pool import StreamPool
from kvsi.subscriber.stream import PublisherSpec
from tests.e2e.truth import mismatches
from tests.waiting import eventually

pytestmark = pytest.mark.e2e


class Harness:
    """A fleet, the streams subscribed to it, a store and the HTTP API over it."""

    def __init__(self, fleet: SimulatedFleet, pool: StreamPool, client: httpx.AsyncClient):
        self.fleet = fleet
        self.pool = pool
        self.client = client

    async def caught_up(self) -> bool:
        """Every pod's last applied seq is the last seq its publisher sent."""
        pods = (await self.client.get("/v1/pods")).json()["pods"]
        applied = {p["pod"]: p["last_seq"] for p in pods}
        return all(
            applied.get(pod) == self.fleet.publisher(pod).next_seq - 1
            for pod in self.fleet.pods
            if self.fleet.publisher(pod).next_seq > 0
        )

    async def all_connected(self) -> bool:
        pods = (await self.client.get("/v1/pods")).json()["pods"]
        return len(pods) == len(self.fleet.pods) and all(p["state"] == "live" for p in pods)


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    store = MemoryStore()
    async with SimulatedFleet(pods=3, sessions=24, seed=11, num_blocks=512) as fleet:
        specs = [PublisherSpec(pod, pub, replay) for pod, pub, replay in fleet.endpoints()]
        pool = StreamPool(specs, store)
        await pool.start()
        transport = httpx.ASGITransport(app=create_app(store))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            h = Harness(fleet, pool, client)
            await eventually(h.all_connected)
            await asyncio.sleep(0.3)  # SUB subscriptions propagate after the TCP connect
            try:
                yield h
            finally:
                await pool.stop()


async def test_index_equals_the_engines_after_agentic_traffic(harness: Harness) -> None:
    stats = await harness.fleet.run(200.0, max_batches=150)
    assert stats.batches > 100
    await eventually(harness.caught_up)
    assert await mismatches(harness.client, harness.fleet) == []
    sessions = (await harness.client.get("/v1/sessions", params={"limit": "5"})).json()
    assert sessions["sessions"], "traffic produced sessions"
    first = sessions["sessions"][0]["session_id"]
    view = (await harness.client.get(f"/v1/sessions/{first}")).json()
    assert view["total_blocks"] == sum(len(b) for b in harness.fleet.session_truth(first).values())


async def test_publisher_killed_and_restarted_mid_stream_leaves_service_up(
    harness: Harness,
) -> None:
    await harness.fleet.run(200.0, max_batches=40)
    await eventually(harness.caught_up)
    await harness.fleet.restart_pod("pod-b")

    async def reconnected() -> bool:
        return await harness.all_connected()

    await eventually(reconnected)
    await asyncio.sleep(0.3)
    await harness.fleet.run(200.0, max_batches=40)
    await eventually(harness.caught_up)
    assert await mismatches(harness.client, harness.fleet) == []
    assert (await harness.client.get("/healthz")).status_code == 200
