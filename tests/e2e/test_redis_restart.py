"""Restart without loss (issue 8, item 6), with real processes on a private redis-server.

A `kvsi serve` on Redis is SIGKILLed while the fleet publishes; the fleet keeps publishing
with no service listening; a new process on the same Redis resumes from the fence stored
there, asks each publisher's replay endpoint for everything after it, and ends with the
fleet's truth: no batch lost, none applied twice.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvsi.simulator.fleet import SimulatedFleet
from kvsi.store.model import Fence, WorkerKey
from kvsi.store.select import open_store
from tests.e2e.services import (
    all_live,
    caught_up,
    fleet_of,
    metrics,
    per_worker,
    pods,
    readiness,
    redis_server,
    services,
    store_url,
    unique_prefix,
    until,
)
from tests.e2e.truth import mismatches

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(120)]

FLEET = {"pods": 3, "sessions": 24, "seed": 5, "num_blocks": 512, "migrate_prob": 0.1}
RATE = 50.0
"""Ticks a second while the service is killed and replaced (the publishers buffer 10,000)."""


class ReplaySpy:
    """Records the start seq of every replay request each publisher serves."""

    def __init__(self, fleet: SimulatedFleet) -> None:
        self.starts: dict[str, list[int]] = {pod: [] for pod in fleet.pods}
        for pod in fleet.pods:
            publisher = fleet.publisher(pod)
            publisher._replay_frames = self._recording(pod, publisher._replay_frames)  # type: ignore[method-assign,assignment]

    def _recording(
        self, pod: str, frames: Callable[[int], list[list[bytes]]]
    ) -> Callable[[int], list[list[bytes]]]:
        def recorded(start_seq: int) -> list[list[bytes]]:
            self.starts[pod].append(start_seq)
            return frames(start_seq)

        return recorded


async def stored_fences(url: str, fleet: SimulatedFleet) -> dict[str, Fence]:
    """The fence of each worker as Redis holds it (read with the product's own store)."""
    store = open_store(url)
    try:
        fences = {pod: await store.fence(WorkerKey(pod, 0)) for pod in fleet.pods}
    finally:
        await store.close()
    out = {pod: fence for pod, fence in fences.items() if fence is not None}
    assert set(out) == set(fleet.pods), fences
    return out


async def test_a_killed_process_is_replaced_and_resumes_from_the_stored_fence() -> None:
    with redis_server() as redis:
        async with fleet_of(**FLEET) as fleet, services() as run:
            url = store_url(redis, unique_prefix())
            first = run.start("first", url, fleet)
            client = await run.client(first)
            await until(lambda: all_live(client, fleet), 30, "pods live", run)

            traffic = fleet.run_in_background(RATE)
            try:

                async def applied_some() -> bool:
                    found = await pods(client)
                    return all((found[pod]["last_seq"] or 0) >= 20 for pod in fleet.pods)

                await until(applied_some, 30, "first process applying", run)
                first.kill()  # mid-stream: the fleet keeps publishing
                assert first.proc.returncode == -9
                fences = await stored_fences(url, fleet)

                async def published_past_the_fences() -> bool:
                    return all(
                        fleet.publisher(pod).next_seq > fences[pod].seq + 40 for pod in fleet.pods
                    )

                await until(published_past_the_fences, 30, "published with no service", run)
                spy = ReplaySpy(fleet)
                # Published before the new process exists: it can only get these by replay.
                unseen = {pod: fleet.publisher(pod).next_seq for pod in fleet.pods}
                second = run.start("second", url, fleet)
                client = await run.client(second)
                began = {pod: fleet.publisher(pod).next_seq for pod in fleet.pods}

                async def following_live_traffic() -> bool:
                    found = await pods(client)
                    return all(
                        found[pod]["state"] == "live" and found[pod]["last_seq"] > began[pod]
                        for pod in fleet.pods
                    )

                await until(following_live_traffic, 30, "second process following", run)
            finally:
                fleet.stop()
                stats = await traffic
            assert stats.batches > 3 * 60, stats

            await until(lambda: caught_up(client, fleet), 30, "caught up", run)
            assert await mismatches(client, fleet) == []
            samples = await metrics(client)
            for pod, found in (await pods(client)).items():
                assert found["state"] == "live" and found["batches_lost"] == 0, found
                fence = fences[pod]
                # It asked the publisher for everything from its stored fence (the fence
                # batch itself comes back as a duplicate: the same engine, see subscriber/).
                assert spy.starts[pod][:1] == [fence.seq], (pod, spy.starts[pod], fence)
                published = fleet.publisher(pod).next_seq
                # Each batch after the fence applied once by the new process, none before it.
                applied = per_worker(samples, "kvsi_batches_total", pod, outcome="applied")
                assert applied == published - 1 - fence.seq, (pod, applied, published, fence)
                replayed = per_worker(samples, "kvsi_batches_replayed_total", pod)
                assert replayed >= unseen[pod] - 1 - fence.seq, (pod, replayed, unseen, fence)
                assert per_worker(samples, "kvsi_batches_lost_total", pod) == 0
            assert await readiness(client) == (200, [])
            assert second.stop() == 0, second.tail()
