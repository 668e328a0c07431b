"""Faults with vLLM's real publisher; after each, the API equals the block pools' content.

A subscriber that starts after vLLM published recovers everything from its replay buffer; a
publisher replaced by a new engine on the same ports (seq back to 0, empty cache) empties
the worker in the index, which then follows the new engine.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.interop.conftest import StartSidecar
from tests.interop.fleet import VllmFleet, agents
from tests.interop.truth import caught_up, mismatches, workers_view
from tests.waiting import eventually

pytestmark = [pytest.mark.interop, pytest.mark.e2e]

CATCH_UP = 30.0
"""Seconds the sidecar gets to apply what the workers published (a loaded 2-core box)."""


@pytest.fixture
def fleet() -> Iterator[VllmFleet]:
    with VllmFleet({"pod-a": 1, "pod-b": 1}, workload=agents(5), num_blocks=96) as fleet:
        yield fleet


async def test_a_subscriber_started_late_replays_vllms_buffer_from_the_start(
    fleet: VllmFleet, sidecars: StartSidecar
) -> None:
    fleet.run(120)
    fleet.reset_prefix_cache("pod-a")
    fleet.run(40)
    fleet.wait_sent()
    sidecar = await sidecars(fleet.workers)
    await eventually(lambda: caught_up(sidecar.client, fleet.workers), within=CATCH_UP)
    assert await mismatches(sidecar.client, fleet.workers) == []
    for (pod, _), worker in fleet.workers.items():
        counters = sidecar.stream(pod).counters
        assert counters.batches_replayed == worker.batches > 0
        assert counters.batches_lost == 0

    fleet.run(40)
    await eventually(lambda: caught_up(sidecar.client, fleet.workers), within=CATCH_UP)
    assert await mismatches(sidecar.client, fleet.workers) == []


async def test_a_publisher_replaced_on_its_ports_empties_the_worker_then_follows_the_new_one(
    fleet: VllmFleet, sidecars: StartSidecar
) -> None:
    sidecar = await sidecars(fleet.workers)
    await sidecar.wait_states({"pod-a": "live", "pod-b": "live"})
    fleet.run(120)
    await eventually(lambda: caught_up(sidecar.client, fleet.workers), within=CATCH_UP)
    assert await mismatches(sidecar.client, fleet.workers) == []
    old = fleet.workers[("pod-b", 0)].resident()

    fleet.restart("pod-b")

    async def emptied() -> bool:  # the new engine holds nothing, and says nothing yet
        blocks: int = (await workers_view(sidecar.client))[("pod-b", 0)]["blocks"]
        return blocks == 0

    await eventually(emptied, within=CATCH_UP)
    assert await mismatches(sidecar.client, fleet.workers) == []
    fleet.run(60)
    await eventually(lambda: caught_up(sidecar.client, fleet.workers), within=CATCH_UP)
    assert await mismatches(sidecar.client, fleet.workers) == []
    assert old - fleet.workers[("pod-b", 0)].resident(), "the index had old blocks to drop"
    counters = sidecar.stream("pod-b").counters
    assert counters.restarts == 1
    assert counters.batches_lost == 0
