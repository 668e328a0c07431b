"""After an eviction wave, what the API says eviction took from each session equals what the
engines' events say (issue #9, item 4), on every store backend.

A simulated fleet whose pools are too small for its sessions evicts all along; one pod's
cache is then reset. Per (session, worker), the API's lost blocks must equal the engine's
count from its own events, re-prefill tokens lost x block size, and the frontier the block
the engine stored last for the session, at its true index in the prompt. The per-worker
gauges, refreshed from the store, must sum the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvsi.api.app import create_app
from kvsi.serve import run_index_metrics
from kvsi.simulator.fleet import SimulatedFleet
from kvsi.store.base import IndexStore
from kvsi.store.hashtext import parse_hash
from kvsi.subscriber.pool import StreamPool
from kvsi.subscriber.stream import PublisherSpec
from tests.conformance.conftest import StoreFactory, make_store  # noqa: F401  (fixture)
from tests.e2e.truth import session_ids
from tests.redis_servers import redis_cluster, redis_server  # noqa: F401  (fixtures)
from tests.waiting import eventually

pytestmark = pytest.mark.e2e

BLOCK_SIZE = 16
Worker = tuple[str, int]


class Harness:
    """A fleet, the streams subscribed to it, a store and the HTTP API over it."""

    def __init__(self, fleet: SimulatedFleet, store: IndexStore, client: httpx.AsyncClient):
        self.fleet = fleet
        self.store = store
        self.client = client

    async def pods(self) -> list[dict[str, object]]:
        pods: list[dict[str, object]] = (await self.client.get("/v1/pods")).json()["pods"]
        return pods

    async def caught_up(self) -> bool:
        applied = {p["pod"]: p["last_seq"] for p in await self.pods()}
        return all(
            applied.get(pod) == self.fleet.publisher(pod).next_seq - 1
            for pod in self.fleet.pods
            if self.fleet.publisher(pod).next_seq > 0
        )

    async def all_live(self) -> bool:
        pods = await self.pods()
        return len(pods) == len(self.fleet.pods) and all(p["state"] == "live" for p in pods)


@pytest.fixture
async def harness(make_store: StoreFactory) -> AsyncIterator[Harness]:  # noqa: F811
    store = await make_store()
    fleet = SimulatedFleet(
        pods=2, sessions=40, seed=3, num_blocks=320, block_size=BLOCK_SIZE, migrate_prob=0.2
    )
    async with fleet:
        specs = [PublisherSpec(pod, pub, replay) for pod, pub, replay in fleet.endpoints()]
        pool = StreamPool(specs, store)
        await pool.start()
        transport = httpx.ASGITransport(app=create_app(store))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            h = Harness(fleet, store, client)
            await eventually(h.all_live)
            await asyncio.sleep(0.3)  # SUB subscriptions propagate after the TCP connect
            try:
                yield h
            finally:
                await pool.stop()


async def mismatches(h: Harness) -> tuple[list[str], dict[Worker, list[int]]]:
    """Where the API's losses and frontiers differ from the engines'; and per worker, the
    truth's (sessions hurt, lost blocks) for the gauges."""
    problems: list[str] = []
    sums: dict[Worker, list[int]] = {}
    for sid in sorted(await session_ids(h.client)):
        view = (await h.client.get(f"/v1/sessions/{sid}")).json()
        got = {(p["pod"], p["dp_rank"]): p for p in view["pods"]}
        lost = h.fleet.loss_truth(sid)
        held = h.fleet.session_truth(sid)
        if set(got) != set(lost) | set(held):
            problems.append(
                f"{sid}: listed on {sorted(got)}, truth {sorted(set(lost) | set(held))}"
            )
        for worker, frontier in h.fleet.frontier_truth(sid).items():
            n = lost.get(worker, 0)
            if n:
                hurt = sums.setdefault(worker, [0, 0])
                hurt[0] += 1
                hurt[1] += n
            pod = got.get(worker)
            if pod is None:
                continue
            want = (n, n * BLOCK_SIZE, frontier)
            f = pod["frontier"]
            said = (
                pod["lost_blocks"],
                pod["reprefill_tokens"],
                None if f is None else (parse_hash(f["block_hash"]), f["position"]),
            )
            if said != want:
                problems.append(f"{sid}@{worker}: {said} != truth {want}")
    return problems, sums


async def gauges(h: Harness) -> dict[tuple[str, str], float]:
    text = (await h.client.get("/metrics")).text
    return {
        (sample.name, sample.labels["worker"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("kvsi_index_") and "worker" in sample.labels
    }


async def test_after_an_eviction_wave_losses_equal_what_the_events_say(harness: Harness) -> None:
    h = harness
    await h.fleet.run(0, max_batches=120)
    await h.fleet.reset_pod("pod-b")
    await h.fleet.run(0, max_batches=20)
    await eventually(h.caught_up)

    problems, sums = await mismatches(h)

    assert problems == []
    hurt = sum(s[0] for s in sums.values())
    assert hurt >= 10, f"the wave hurt only {hurt} residencies: the check would be idle"
    emptied = [
        sid
        for sid in await session_ids(h.client)
        for worker in h.fleet.loss_truth(sid)
        if worker not in h.fleet.session_truth(sid)
    ]
    assert emptied, "no session lost all it had on a worker: that listing went unchecked"
    want = {
        (name, f"{pod}/{rank}"): value
        for (pod, rank), (n_hurt, n_lost) in sums.items()
        for name, value in (
            ("kvsi_index_sessions_hurt", n_hurt),
            ("kvsi_index_lost_blocks", n_lost),
            ("kvsi_index_reprefill_tokens", n_lost * BLOCK_SIZE),
        )
    }

    async def refreshed() -> bool:
        found = await gauges(h)
        return all(found.get(key) == value for key, value in want.items())

    refresher = asyncio.create_task(run_index_metrics(h.store, 0.05))
    try:
        await eventually(refreshed)
    finally:
        refresher.cancel()
