"""The fault suite's parts: a sidecar (stream pool + REST API over one store) and the truth.

Imports the API only through HTTP (httpx over ASGI) and the simulator only through its truth
accessors and fault hooks: what a router sees is what is checked.
"""

from __future__ import annotations

from typing import Any

import httpx

from kvsi.api.app import create_app
from kvsi.serve import readiness_probe
from kvsi.simulator.engine import SimulatedEngine
from kvsi.simulator.fleet import SimulatedFleet
from kvsi.store.base import IndexStore
from kvsi.store.model import WorkerKey
from kvsi.subscriber.pool import StreamPool
from kvsi.subscriber.stream import IngestOptions, PublisherSpec, WorkerStream
from tests.e2e.truth import listing, session_ids
from tests.waiting import eventually

FAULTS = IngestOptions(replay_timeout=1.0, replay_attempts=2, store_retry_max=0.05)
"""Ingest bounds for the fault tests: a dead replay shows within seconds."""


class Sidecar:
    """kvsi's ingest and API in this process, over `store`, subscribed to `specs`."""

    def __init__(
        self, store: IndexStore, specs: list[PublisherSpec], options: IngestOptions = FAULTS
    ) -> None:
        self.store = store
        self.pool = StreamPool(specs, store, options)
        app = create_app(store, readiness=readiness_probe(store, self.pool))
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")

    @classmethod
    def for_fleet(
        cls, store: IndexStore, fleet: SimulatedFleet, options: IngestOptions = FAULTS
    ) -> Sidecar:
        specs = [PublisherSpec(pod, pub, replay) for pod, pub, replay in fleet.endpoints()]
        return cls(store, specs, options)

    async def start(self) -> Sidecar:
        await self.pool.start()
        return self

    async def stop(self) -> None:
        await self.pool.stop()
        await self.client.aclose()

    def stream(self, pod: str) -> WorkerStream:
        (found,) = [s for s in self.pool.streams if s.spec.pod == pod]
        return found

    async def pods(self) -> dict[str, dict[str, Any]]:
        response = await self.client.get("/v1/pods")
        response.raise_for_status()
        return {p["pod"]: p for p in response.json()["pods"]}

    async def wait_caught_up(self, publishers: dict[str, int], within: float = 15.0) -> None:
        """Until each pod's last applied seq is its publisher's last (`next_seq - 1`)."""

        async def caught_up() -> bool:
            pods = await self.pods()
            return all(
                pod in pods and pods[pod]["last_seq"] == next_seq - 1
                for pod, next_seq in publishers.items()
                if next_seq > 0
            )

        await eventually(caught_up, within=within)

    async def wait_states(self, states: dict[str, str], within: float = 10.0) -> None:
        async def reached() -> bool:
            pods = await self.pods()
            return all(pods.get(pod, {}).get("state") == want for pod, want in states.items())

        await eventually(reached, within=within)


def next_seqs(fleet: SimulatedFleet) -> dict[str, int]:
    return {pod: fleet.publisher(pod).next_seq for pod in fleet.pods}


def engines(fleet: SimulatedFleet) -> dict[str, SimulatedEngine]:
    return {pod: fleet.engine(pod) for pod in fleet.pods}


async def mismatches(client: httpx.AsyncClient, truth: dict[str, SimulatedEngine]) -> list[str]:
    """Where the REST API disagrees with the engines: each pod's resident blocks, and each
    session's blocks (overall and per pod); [] when the index equals the truth."""
    problems: list[str] = []
    per_session: dict[str, dict[str, set[int]]] = {}
    for pod, engine in truth.items():
        want = engine.resident()
        got = await listing(client, f"/v1/pods/{pod}/blocks")
        if got != want:
            problems.append(f"{pod}: {len(got - want)} extra, {len(want - got)} missing blocks")
        for session, blocks in engine.session_residency().items():
            per_session.setdefault(session, {})[pod] = blocks
    indexed = {
        s["session_id"]
        for s in (await client.get("/v1/sessions", params={"limit": "1000"})).json()["sessions"]
        if s["blocks"] > 0
    }
    listed = await session_ids(client)
    if indexed - set(per_session):
        problems.append(
            f"sessions with blocks only in the index: {sorted(indexed - set(per_session))}"
        )
    for session, by_pod in sorted(per_session.items()):
        if session not in listed:
            problems.append(f"{session}: missing from the index")
            continue
        union = set().union(*by_pod.values())
        got = await listing(client, f"/v1/sessions/{session}/blocks")
        if got != union:
            problems.append(f"{session}: {len(got - union)} extra, {len(union - got)} missing")
        for pod, blocks in by_pod.items():
            got = await listing(client, f"/v1/sessions/{session}/blocks", pod=pod)
            if got != blocks:
                problems.append(f"{session}@{pod}: got {len(got)}, truth {len(blocks)}")
    return problems


async def sessions_with_blocks(client: httpx.AsyncClient) -> set[str]:
    """Sessions the API lists with at least one block, walking every page."""
    out: set[str] = set()
    cursor: str | None = None
    while True:
        params = {"limit": "1000"} | ({"cursor": cursor} if cursor else {})
        body = (await client.get("/v1/sessions", params=params)).json()
        out.update(s["session_id"] for s in body["sessions"] if s["blocks"] > 0)
        cursor = body["next_cursor"]
        if cursor is None:
            return out


def worker(pod: str) -> WorkerKey:
    return WorkerKey(pod, 0)
