"""A sidecar restarted on the same store resumes from the stored fence through replay."""

from __future__ import annotations

import pytest

from kvsi.store.model import ApplyOutcome
from tests.faults.conftest import Parts
from tests.faults.harness import engines, mismatches, next_seqs, worker
from tests.subscriber.stores import RecordingStore

pytestmark = pytest.mark.e2e


async def test_a_new_pool_on_the_same_store_resumes_from_the_fence(parts: Parts) -> None:
    fleet = await parts.fleet()
    store = RecordingStore()
    first = await parts.sidecar(store, fleet)
    await first.wait_states({pod: "live" for pod in fleet.pods})
    await fleet.run(0, max_batches=30)
    await first.wait_caught_up(next_seqs(fleet))
    resume_at = {pod: (await store.inner.fence(worker(pod))) for pod in fleet.pods}
    await first.stop()

    await fleet.run(0, max_batches=40)  # published while no sidecar listens
    second = await parts.sidecar(store, fleet)
    await second.wait_caught_up(next_seqs(fleet))
    assert await mismatches(second.client, engines(fleet)) == []
    await second.wait_states({pod: "live" for pod in fleet.pods})
    for pod in fleet.pods:
        fence = resume_at[pod]
        assert fence is not None
        counters = second.stream(pod).counters
        assert counters.batches_replayed == fleet.publisher(pod).next_seq - 1 - fence.seq
        assert counters.batches_lost == 0 and counters.gaps == 0
        assert store.seqs(worker(pod)) == list(range(fleet.publisher(pod).next_seq))
    assert {outcome for _, _, outcome in store.applied} == {ApplyOutcome.APPLIED}
