"""One `kvsi serve` process follows 1,000 vLLM publishers exactly, their buffered batches
recovered by replay; a process whose file limit is too low shows the workers it has no room
for as `degraded` (saying why, counted, `/readyz` 503), never as `live` with nothing.

The publishers (simulator.fleet, vLLM 0.33's frames and replay) run in the test process on
loopback TCP; the service is a real process given `--pod/--replay` pairs, as in the issue.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from kvsi.simulator.fleet import SimulatedFleet
from tests.e2e.services import (
    Service,
    Services,
    fleet_of,
    metrics,
    per_worker,
    pods,
    readiness,
    services,
    until,
)
from tests.e2e.truth import listing

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

BATCHES = 5
"""Batches each publisher sends before the service starts: only replay can deliver them."""


def fleet_options(workers: int) -> dict[str, Any]:
    """About one request per worker per batch, so every publisher buffers a few batches."""
    return {"pods": workers, "sessions": workers, "requests_per_batch": 1, "seed": 3}


def exact(pod: dict[str, Any], fleet: SimulatedFleet) -> bool:
    """The pod's entry in /v1/pods says it applied all its publisher sent, and holds as many
    blocks as its engine does."""
    name = pod["pod"]
    sent = fleet.publisher(name).next_seq
    return pod["last_seq"] == (sent - 1 if sent else None) and pod["blocks"] == len(
        fleet.resident(name)
    )


async def settled(client: httpx.AsyncClient, fleet: SimulatedFleet) -> dict[str, Any] | None:
    """/v1/pods once every worker is listed and is either live and exact or degraded."""
    found = await pods(client)
    if set(found) != set(fleet.pods):
        return None
    for pod in found.values():
        if pod["state"] == "degraded":
            continue
        if pod["state"] != "live" or not exact(pod, fleet):
            return None
    return found


async def started(run: Services, fleet: SimulatedFleet, **options: Any) -> Service:
    await fleet.run(0, max_batches=BATCHES)
    assert sum(fleet.publisher(p).next_seq for p in fleet.pods) >= len(fleet.pods) * 2
    return run.start("kvsi", "memory", fleet, **options)


async def test_one_process_follows_1000_publishers_exactly_after_replaying_their_buffers() -> None:
    async with fleet_of(**fleet_options(1000)) as fleet, services() as run:
        service = await started(run, fleet)
        client = await run.client(service)
        found = await until(lambda: settled(client, fleet), 240, "1,000 workers exact", run)
        assert {p["state"] for p in found.values()} == {"live"}
        for name in fleet.pods:
            assert await listing(client, f"/v1/pods/{name}/blocks") == fleet.resident(name)
        assert await readiness(client) == (200, [])
        samples = await metrics(client)
        assert samples[("kvsi_fleet_workers", ())] == 1000
        assert samples[("kvsi_fleet_workers_degraded", ())] == 0
        assert not [k for k in samples if k[0] == "kvsi_fleet_resource_failures_total"]
        assert "ingest.limits_too_low" not in service.output()


async def test_workers_past_a_low_file_limit_are_degraded_counted_and_fail_readyz() -> None:
    async with fleet_of(**fleet_options(100)) as fleet, services() as run:
        # 100 streams need ~400 descriptors besides the process's own: some have no room.
        service = await started(run, fleet, file_limit=400)
        client = await run.client(service)
        found = await until(lambda: settled(client, fleet), 60, "workers settled", run)
        degraded = sorted(name for name, p in found.items() if p["state"] == "degraded")
        assert 0 < len(degraded) < 100, "some workers have room, some not"
        for name in degraded:
            detail = found[name]["state_detail"]
            assert "no room for this stream" in detail and "ulimit -n" in detail, detail
            assert found[name]["blocks"] == 0
        status, reasons = await readiness(client)
        assert status == 503
        assert sorted(r.split(":")[0] for r in reasons if "no room" in r) == [
            f"worker {name}/0" for name in degraded
        ]
        samples = await metrics(client)
        assert samples[("kvsi_fleet_resource_failures_total", (("reason", "no_room"),))] == len(
            degraded
        )
        assert samples[("kvsi_fleet_workers_degraded", ())] == len(degraded)
        for name in degraded:
            assert per_worker(samples, "kvsi_resource_failures_total", name, reason="no_room") == 1
        assert service.output().count("ingest.limits_too_low") == 1
