"""A sidecar that starts after the engines recovers their history from the replay buffers."""

from __future__ import annotations

import pytest

from kvsi.store.memory import MemoryStore
from tests.faults.conftest import Parts
from tests.faults.harness import engines, mismatches, next_seqs

pytestmark = pytest.mark.e2e


async def test_a_sidecar_started_late_recovers_the_history_without_new_traffic(
    parts: Parts,
) -> None:
    fleet = await parts.fleet()
    before = await fleet.run(0, max_batches=60)
    assert before.batches > 60
    sidecar = await parts.sidecar(MemoryStore(), fleet)
    await sidecar.wait_caught_up(next_seqs(fleet))  # no batch was published since it started
    assert await mismatches(sidecar.client, engines(fleet)) == []
    await sidecar.wait_states({pod: "live" for pod in fleet.pods})
    for pod in fleet.pods:
        counters = sidecar.stream(pod).counters
        assert counters.batches_replayed == fleet.publisher(pod).next_seq
        assert counters.batches_lost == 0

    await fleet.run(0, max_batches=40)
    await sidecar.wait_caught_up(next_seqs(fleet))
    assert await mismatches(sidecar.client, engines(fleet)) == []
