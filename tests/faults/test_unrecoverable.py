"""Losses replay cannot repair: the worker is marked in the API, the stale policy runs, and the
index under-reports rather than over-reports until the worker is exact again."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvsi.store.memory import MemoryStore
from kvsi.subscriber.stream import PublisherSpec
from tests.e2e.truth import listing
from tests.faults.conftest import Parts
from tests.faults.harness import FAULTS, Sidecar, engines, mismatches, next_seqs
from tests.waiting import eventually

pytestmark = pytest.mark.e2e


async def test_a_buffer_outrun_by_a_sidecar_outage_degrades_and_expires_stale_entries(
    parts: Parts,
) -> None:
    fleet = await parts.fleet(buffer_steps=20, num_blocks=256, sessions=20)
    store = MemoryStore()
    first = await parts.sidecar(store, fleet)
    await first.wait_states({pod: "live" for pod in fleet.pods})
    await fleet.run(0, max_batches=40)
    await first.wait_caught_up(next_seqs(fleet))
    await first.stop()
    await fleet.run(0, max_batches=80)  # more than the 20 batches the publishers keep

    second = await parts.sidecar(store, fleet, replace(FAULTS, unconfirmed_ttl=0.5))
    await second.wait_caught_up(next_seqs(fleet))
    await second.wait_states({pod: "degraded" for pod in fleet.pods})
    pods = await second.pods()
    for pod in fleet.pods:
        assert pods[pod]["batches_lost"] > 0
        assert "the publisher's replay buffer starts at seq" in pods[pod]["state_detail"]
    sessions = (await second.client.get("/v1/sessions", params={"limit": "5"})).json()
    for summary in sessions["sessions"]:
        view = (await second.client.get(f"/v1/sessions/{summary['session_id']}")).json()
        assert all(p["state"] == "degraded" for p in view["pods"]), "never shown as exact"

    async def expired() -> bool:
        return all(second.stream(pod).counters.unconfirmed_dropped > 0 for pod in fleet.pods)

    await eventually(expired)
    for pod in fleet.pods:
        held = await listing(second.client, f"/v1/pods/{pod}/blocks")
        assert held <= fleet.resident(pod), "after the stale policy: under-report only"
        assert "dropped" in (await second.pods())[pod]["state_detail"]

    for pod in fleet.pods:
        await fleet.reset_pod(pod)  # AllBlocksCleared: the worker is exact again
    await fleet.run(0, max_batches=20)
    await second.wait_caught_up(next_seqs(fleet))
    await second.wait_states({pod: "live" for pod in fleet.pods})
    assert await mismatches(second.client, engines(fleet)) == []
    assert all(p["batches_lost"] > 0 for p in (await second.pods()).values()), "history kept"


async def test_without_a_replay_endpoint_a_gap_is_marked_not_hidden(parts: Parts) -> None:
    fleet = await parts.fleet(pods=1)
    store = MemoryStore()
    ((pod, endpoint, _),) = fleet.endpoints()
    sidecar = Sidecar(store, [PublisherSpec(pod, endpoint)])
    await sidecar.start()
    try:
        await sidecar.wait_states({pod: "live"})
        await fleet.run(0, max_batches=10)
        fleet.publisher(pod).drop_next(5)
        await fleet.run(0, max_batches=10)
        await sidecar.wait_caught_up(next_seqs(fleet))
        await sidecar.wait_states({pod: "degraded"})
        status = (await sidecar.pods())[pod]
        assert status["batches_lost"] == 5
        assert "no replay endpoint is configured" in status["state_detail"]
    finally:
        await sidecar.stop()
