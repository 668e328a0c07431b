"""An index store outage (any backend that raises; Redis stopped is one): ingest keeps reading
into its bounded queue, /readyz says not ready and why, and when the store returns the
buffered batches apply in order; an overflow is repaired by replay."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import pytest

from kvsi.store.model import ApplyOutcome, WorkerState
from tests.faults.conftest import Parts
from tests.faults.harness import FAULTS, engines, mismatches, next_seqs, worker
from tests.subscriber.stores import RecordingStore
from tests.waiting import eventually

pytestmark = pytest.mark.e2e


async def readiness(client: httpx.AsyncClient) -> tuple[int, list[str]]:
    response = await client.get("/readyz")
    reasons: list[str] = response.json().get("reasons", [])
    return response.status_code, reasons


async def test_batches_buffered_while_the_store_is_down_apply_in_order_when_it_returns(
    parts: Parts,
) -> None:
    fleet = await parts.fleet()
    store = RecordingStore()
    sidecar = await parts.sidecar(store, fleet)
    await sidecar.wait_states({pod: "live" for pod in fleet.pods})
    await fleet.run(0, max_batches=20)
    await sidecar.wait_caught_up(next_seqs(fleet))
    assert await readiness(sidecar.client) == (200, [])

    store.down = True
    await fleet.run(0, max_batches=30)

    async def buffering() -> bool:
        return all(len(sidecar.stream(pod).inbox) > 0 for pod in fleet.pods)

    await eventually(buffering)
    status, reasons = await readiness(sidecar.client)
    assert status == 503
    assert any(r.startswith("index store unavailable") for r in reasons)
    assert any("buffered during the index store outage" in r for r in reasons)
    assert (await sidecar.client.get("/v1/pods")).status_code == 503

    store.down = False
    await sidecar.wait_caught_up(next_seqs(fleet))
    assert await mismatches(sidecar.client, engines(fleet)) == []
    for pod in fleet.pods:
        assert store.seqs(worker(pod)) == list(range(fleet.publisher(pod).next_seq))
        assert sidecar.stream(pod).counters.batches_lost == 0
    assert {outcome for _, _, outcome in store.applied} == {ApplyOutcome.APPLIED}

    async def ready() -> bool:
        return await readiness(sidecar.client) == (200, [])

    await eventually(ready)
    await sidecar.wait_states({pod: "live" for pod in fleet.pods})


async def test_an_outage_longer_than_the_queue_marks_then_repairs_by_replay(
    parts: Parts,
) -> None:
    fleet = await parts.fleet()
    store = RecordingStore()
    sidecar = await parts.sidecar(store, fleet, replace(FAULTS, queue_size=8))
    await sidecar.wait_states({pod: "live" for pod in fleet.pods})
    await fleet.run(0, max_batches=10)
    await sidecar.wait_caught_up(next_seqs(fleet))

    store.down = True
    await fleet.run(0, max_batches=60)

    async def overflowed() -> bool:
        return all(sidecar.stream(pod).inbox.overflowed > 0 for pod in fleet.pods)

    await eventually(overflowed)
    _, reasons = await readiness(sidecar.client)
    assert any("dropped by a full ingest queue" in r for r in reasons), reasons

    await asyncio.sleep(0.1)
    store.down = False
    await sidecar.wait_caught_up(next_seqs(fleet))
    assert await mismatches(sidecar.client, engines(fleet)) == []
    for pod in fleet.pods:
        counters = sidecar.stream(pod).read_counters()
        assert counters.queue_overflow > 0 and counters.batches_replayed > 0
        assert counters.batches_lost == 0
        assert store.seqs(worker(pod)) == list(range(fleet.publisher(pod).next_seq))
        marks = [
            status
            for w, status in store.statuses
            if w == worker(pod) and "dropped by a full ingest queue" in status.detail
        ]
        assert marks and marks[0].state is WorkerState.DEGRADED, "marked in /v1/pods first"
    await sidecar.wait_states({pod: "live" for pod in fleet.pods})

    async def ready() -> bool:
        return await readiness(sidecar.client) == (200, [])

    await eventually(ready)
