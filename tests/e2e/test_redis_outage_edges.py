"""Edges of a Redis outage beyond the buffered replay (issue 8, items 7 and 8), with real
processes and a real private redis-server stopped and started on the same port.

- The janitor that ages out idle sessions keeps working after an outage.
- During an outage, concurrent reads get their 503 promptly with the default (console)
  log format.
- The `kvsi_worker_degraded` gauge agrees with /v1/pods' `degraded` state while a queue
  overflow is being repaired.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from kvsi.simulator.fleet import SimulatedFleet
from tests.e2e.services import (
    FAST_RETRY,
    PERSISTENT,
    burst,
    caught_up,
    metrics,
    outage_reported,
    per_worker,
    sidecar_on_redis,
    until,
)
from tests.e2e.truth import listing

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(120)]

FLEET = {"pods": 2, "sessions": 16, "seed": 3, "num_blocks": 512, "migrate_prob": 0.1}
RATE = 100.0

IDLE, INTERVAL = 5.0, 0.3
"""Session residencies are dropped after 5 s without a store; the janitor looks every 0.3 s."""


async def idle_empty_sessions(client: httpx.AsyncClient, older_than: float) -> list[str]:
    """Sessions listed with no block whose last store is before `older_than`."""
    out: list[str] = []
    cursor: str | None = None
    while True:
        params = {"limit": "1000"} | ({"cursor": cursor} if cursor else {})
        response = await client.get("/v1/sessions", params=params)
        response.raise_for_status()
        body = response.json()
        out += [
            s["session_id"]
            for s in body["sessions"]
            if s["blocks"] == 0 and s["last_seen"] < older_than
        ]
        cursor = body["next_cursor"]
        if cursor is None:
            return out


async def differences_from_truth(
    client: httpx.AsyncClient, fleet: SimulatedFleet, *, sessions: bool = True
) -> dict[str, list[str]]:
    """Per pod, where the index differs from its engine: its blocks, and (`sessions`) each
    session's blocks on it (a session the index does not know, a 404, is one of the
    differences)."""
    problems: dict[str, list[str]] = {}
    for pod in fleet.pods:
        found = problems.setdefault(pod, [])
        got, want = await listing(client, f"/v1/pods/{pod}/blocks"), fleet.resident(pod)
        if got != want:
            found.append(
                f"{len(want - got)} of {len(want)} blocks missing, {len(got - want)} extra"
            )
        if not sessions:
            continue
        for session_id, blocks in sorted(fleet.session_residency(pod).items()):
            response = await client.get(f"/v1/sessions/{session_id}/blocks", params={"pod": pod})
            if response.status_code == 404:
                found.append(f"{session_id} ({len(blocks)} blocks here) unknown to the index")
            elif await listing(client, f"/v1/sessions/{session_id}/blocks", pod=pod) != blocks:
                found.append(f"{session_id}: blocks differ")
    return problems


async def test_idle_sessions_still_age_out_after_a_redis_outage() -> None:
    env = FAST_RETRY | {
        "KVSI_SESSION_IDLE_SECONDS": str(IDLE),
        "KVSI_JANITOR_INTERVAL_SECONDS": str(INTERVAL),
    }
    async with sidecar_on_redis(FLEET, env, 40, *PERSISTENT, rate=RATE) as sidecar:
        redis, fleet, run, service, client = sidecar
        # An outage spanning several janitor rounds, each of which fails.
        redis.stop()
        await until(lambda: outage_reported(client, fleet, buffered=False), 20, "not ready", run)

        async def janitor_failed_twice() -> bool:
            return service.output().count("janitor.pass_skipped") >= 2

        await until(janitor_failed_twice, 10, "janitor rounds during the outage", run)
        redis.start(redis.port)

        await fleet.run(RATE, max_batches=40)
        await until(lambda: caught_up(client, fleet), 30, "caught up after the outage", run)
        assert await burst(client, fleet) == [], "reads answer right after the outage"
        # (truth.mismatches would race with the janitor: it walks sessions it listed.)
        # Sessions not stored since before the outage have aged out (IDLE is short):
        # only the pods' blocks, which expiry leaves, are compared.
        assert await differences_from_truth(client, fleet, sessions=False) == {
            pod: [] for pod in fleet.pods
        }
        for pod in fleet.pods:  # every session loses its blocks: all become idle + empty
            await fleet.reset_pod(pod)
        await until(lambda: caught_up(client, fleet), 30, "reset applied", run)
        assert await idle_empty_sessions(client, time.time() + 60), "empty sessions listed"

        async def aged_out() -> bool:
            return not await idle_empty_sessions(client, time.time() + 60)

        await until(aged_out, IDLE + 15, "empty sessions aged out after the outage", run)
        assert service.running
        assert service.stop() == 0, service.tail()


async def timed_get(client: httpx.AsyncClient, url: str) -> tuple[int | str, float]:
    """(status or "timeout", seconds) of one GET."""
    began = time.monotonic()
    try:
        status: int | str = (await client.get(url, timeout=30)).status_code
    except httpx.TimeoutException:
        status = "timeout"
    return status, round(time.monotonic() - began, 2)


async def test_reads_during_an_outage_answer_503_promptly_with_the_default_log_format() -> None:
    env = FAST_RETRY | {"KVSI_LOG_FORMAT": "console"}  # the default of `kvsi serve`
    async with sidecar_on_redis(FLEET, env, 20, rate=RATE) as sidecar:
        redis, fleet, run, service, client = sidecar
        redis.stop()
        await until(lambda: outage_reported(client, fleet, False), 20, "not ready", run)
        logged = service.log.stat().st_size
        # 16 routers' reads at once: each should get "try later" (503) right away.
        answers = await asyncio.gather(
            *(timed_get(client, "/v1/pods/pod-a/blocks") for _ in range(16))
        )
        logged = service.log.stat().st_size - logged
        assert service.stop() == 0, service.tail()
        assert {status for status, _ in answers} == {503}, answers
        slow = sorted(seconds for _, seconds in answers if seconds > 2.0)
        assert slow == [], (
            f"{len(slow)} of 16 failing reads took over 2 s (up to {slow[-1]} s); "
            f"the service logged {logged} bytes for them"
        )


async def test_degraded_gauge_agrees_with_the_degraded_state_during_an_overflow() -> None:
    env = FAST_RETRY | {"KVSI_INGEST_QUEUE_SIZE": "8"}
    async with sidecar_on_redis(FLEET, env, 10, *PERSISTENT, rate=RATE) as sidecar:
        redis, fleet, run, service, client = sidecar
        redis.stop()
        await fleet.run(RATE, max_batches=40)

        async def overflowed() -> bool:
            samples = await metrics(client)
            return all(
                per_worker(samples, "kvsi_queue_overflow_total", pod) > 0 for pod in fleet.pods
            )

        await until(overflowed, 20, "inbox overflowed", run)
        reasons = await until(
            lambda: outage_reported(client, fleet, buffered=True), 5, "not ready", run
        )
        repairing = [r for r in reasons if "repairing by replay" in r]
        assert len(repairing) == len(fleet.pods), reasons  # the workers are degraded
        samples = await metrics(client)
        gauges = {pod: per_worker(samples, "kvsi_worker_degraded", pod) for pod in fleet.pods}
        fleet_gauge = samples[("kvsi_fleet_workers_degraded", ())]
        redis.start(redis.port)
        await until(lambda: caught_up(client, fleet), 30, "caught up after the outage", run)
        assert service.stop() == 0, service.tail()
        assert (gauges, fleet_gauge) == ({pod: 1 for pod in fleet.pods}, len(fleet.pods))
