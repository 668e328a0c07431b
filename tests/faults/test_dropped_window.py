"""A window of live messages that never reach the subscriber is repaired by replay, in order."""

from __future__ import annotations

import pytest

from kvsi.store.model import ApplyOutcome
from tests.faults.conftest import Parts
from tests.faults.harness import engines, mismatches, next_seqs, worker
from tests.subscriber.stores import RecordingStore

pytestmark = pytest.mark.e2e


async def test_a_dropped_window_is_replayed_and_applied_in_order_exactly_once(
    parts: Parts,
) -> None:
    fleet = await parts.fleet()
    store = RecordingStore()
    sidecar = await parts.sidecar(store, fleet)
    await sidecar.wait_states({pod: "live" for pod in fleet.pods})
    await fleet.run(0, max_batches=20)
    fleet.publisher("pod-a").drop_next(25)  # as PUB does at its high-water mark
    await fleet.run(0, max_batches=50)
    await sidecar.wait_caught_up(next_seqs(fleet))
    assert await mismatches(sidecar.client, engines(fleet)) == []

    counters = sidecar.stream("pod-a").counters
    assert counters.gaps == 1 and counters.batches_missed == 25
    assert counters.batches_replayed >= 25 and counters.batches_lost == 0
    published = fleet.publisher("pod-a").next_seq
    assert store.seqs(worker("pod-a")) == list(range(published)), "in order, each once"
    assert {outcome for _, _, outcome in store.applied} == {ApplyOutcome.APPLIED}
    assert (await sidecar.pods())["pod-a"]["state"] == "live"
    assert (await sidecar.pods())["pod-a"]["batches_lost"] == 0
