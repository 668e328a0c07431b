"""A publisher killed and restarted on the same port: visible in /v1/pods, emptied, rebuilt."""

from __future__ import annotations

import asyncio

import pytest

from kvsi.store.memory import MemoryStore
from tests.faults.conftest import Parts
from tests.faults.harness import engines, mismatches, next_seqs
from tests.waiting import eventually

pytestmark = pytest.mark.e2e


async def test_a_killed_engine_shows_disconnected_then_its_restart_empties_the_worker(
    parts: Parts,
) -> None:
    fleet = await parts.fleet()
    sidecar = await parts.sidecar(MemoryStore(), fleet)
    await sidecar.wait_states({pod: "live" for pod in fleet.pods})
    await fleet.run(0, max_batches=40)
    await sidecar.wait_caught_up(next_seqs(fleet))
    assert (await sidecar.pods())["pod-b"]["blocks"] > 0

    seen: list[tuple[str, str]] = []

    async def watch() -> None:
        while True:
            pod = (await sidecar.pods())["pod-b"]
            seen.append((pod["state"], pod["state_detail"]))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        await fleet.restart_pod("pod-b")  # killed, then a new empty engine on the same ports

        async def back_and_emptied() -> bool:
            pod = (await sidecar.pods())["pod-b"]
            seen.append((pod["state"], pod["state_detail"]))
            return pod["state"] == "live" and pod["blocks"] == 0 and len(seen) > 1

        await eventually(back_and_emptied)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    states = [state for state, _ in seen]
    assert "disconnected" in states, "the kill was visible in /v1/pods"
    assert states.index("disconnected") < len(states) - 1 - states[::-1].index("live")
    assert any("disconnected" in detail for state, detail in seen if state == "disconnected")
    assert await mismatches(sidecar.client, engines(fleet)) == []

    await fleet.run(0, max_batches=40)
    await sidecar.wait_caught_up(next_seqs(fleet))
    assert await mismatches(sidecar.client, engines(fleet)) == []
    counters = sidecar.stream("pod-b").counters
    assert counters.restarts == 1
    assert counters.gaps == 0 and counters.batches_lost == 0
    assert (await sidecar.pods())["pod-b"]["state"] == "live"


async def test_a_restart_in_the_middle_of_traffic_is_rebuilt_from_the_new_engine(
    parts: Parts,
) -> None:
    fleet = await parts.fleet()
    sidecar = await parts.sidecar(MemoryStore(), fleet)
    await sidecar.wait_states({pod: "live" for pod in fleet.pods})
    traffic = fleet.run_in_background(200.0)
    await asyncio.sleep(0.4)
    await fleet.restart_pod("pod-a")  # its first batches go out before the SUB reconnects
    await asyncio.sleep(0.6)
    fleet.stop()
    await traffic
    await sidecar.wait_caught_up(next_seqs(fleet))
    assert await mismatches(sidecar.client, engines(fleet)) == []
    counters = sidecar.stream("pod-a").counters
    assert counters.restarts == 1
    assert counters.batches_lost == 0
    await sidecar.wait_states({pod: "live" for pod in fleet.pods})
