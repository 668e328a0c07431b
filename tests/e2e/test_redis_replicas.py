"""Replicas on one Redis (issue 8, item 5), as real `kvsi serve` processes on a private
redis-server, fed by an in-process simulated fleet whose engines are the truth.

- Two full processes on the same prefix, subscribed to the same publishers, end with the
  fleet's truth, with exactly the index a process alone builds (on another prefix), and
  every batch applied exactly once across them.
- An ingest-only process (`--no-api`) plus an API-only process (`--no-ingest`) on one
  prefix answer like a process doing both.
"""

from __future__ import annotations

from functools import partial

import pytest

from tests.e2e.services import (
    all_live,
    caught_up,
    differences,
    fleet_of,
    metrics,
    per_worker,
    pods,
    readiness,
    redis_server,
    services,
    snapshot,
    store_url,
    unique_prefix,
    until,
)
from tests.e2e.truth import mismatches

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(120)]

FLEET = {"pods": 3, "sessions": 24, "seed": 21, "num_blocks": 512, "migrate_prob": 0.1}
"""Small engines (512 blocks) so traffic evicts and sessions migrate: removals matter too."""

RATE, TICKS = 100.0, 200
"""2 s of traffic: a few hundred batches, thousands of block events."""


async def test_two_replicas_equal_the_truth_and_the_index_one_process_builds() -> None:
    with redis_server() as redis:
        async with fleet_of(**FLEET) as fleet, services() as run:
            shared = store_url(redis, unique_prefix())
            replicas = [
                run.start("replica-a", shared, fleet),
                run.start("replica-b", shared, fleet),
            ]
            alone = run.start("alone", store_url(redis, unique_prefix()), fleet)
            a, b, c = [await run.client(s) for s in (*replicas, alone)]
            for client in (a, b, c):
                await until(partial(all_live, client, fleet), 30, "pods live", run)

            stats = await fleet.run(RATE, max_batches=TICKS)
            assert stats.batches > 300 and stats.events > 1000, stats
            for client in (a, b, c):
                await until(partial(caught_up, client, fleet), 30, "caught up", run)

            for client in (a, b, c):
                assert await mismatches(client, fleet) == [], client.base_url
            seen_a = await snapshot(a, fleet.pods)
            assert len(seen_a["sessions"]) >= 10, "traffic spread sessions over the fleet"
            assert differences(seen_a, await snapshot(b, fleet.pods)) == []
            assert differences(seen_a, await snapshot(c, fleet.pods)) == []

            # Exactly once: of the two replicas' store calls per batch, one applied it.
            ma, mb, mc = [await metrics(client) for client in (a, b, c)]
            for pod in fleet.pods:
                published = fleet.publisher(pod).next_seq
                applied = [
                    per_worker(m, "kvsi_batches_total", pod, outcome="applied") for m in (ma, mb)
                ]
                assert sum(applied) == published, (pod, applied, published)
                assert per_worker(mc, "kvsi_batches_total", pod, outcome="applied") == published
                for m in (ma, mb, mc):
                    assert per_worker(m, "kvsi_batches_lost_total", pod) == 0
            for client in (a, b, c):
                assert await readiness(client) == (200, [])
                assert all(p["batches_lost"] == 0 for p in (await pods(client)).values())
            assert [s.stop() for s in run.started] == [0, 0, 0], run.logs()


async def test_ingest_only_plus_api_only_answer_like_one_process() -> None:
    with redis_server() as redis:
        async with fleet_of(**FLEET) as fleet, services() as run:
            split = store_url(redis, unique_prefix())
            ingest = run.start("ingest-only", split, fleet, "--no-api")
            api = run.start("api-only", split, None, "--no-ingest")
            both = run.start("both", store_url(redis, unique_prefix()), fleet)
            reader, whole = await run.client(api), await run.client(both)
            # The API-only process learns the workers from Redis: the ingest-only one wrote
            # their states there.
            for client in (reader, whole):
                await until(partial(all_live, client, fleet), 30, "pods live", run)

            stats = await fleet.run(RATE, max_batches=TICKS)
            assert stats.batches > 300, stats
            for client in (reader, whole):
                await until(partial(caught_up, client, fleet), 30, "caught up", run)

            assert ingest.running and ingest.url == "", "ingest-only serves no HTTP"
            assert "serving on" not in ingest.output()
            assert await mismatches(reader, fleet) == []
            assert await mismatches(whole, fleet) == []
            assert (
                differences(await snapshot(reader, fleet.pods), await snapshot(whole, fleet.pods))
                == []
            )
            assert await readiness(reader) == (200, [])
            # The API-only process ingests nothing: no per-worker ingest counters of its own.
            assert not any(name.startswith("kvsi_batches") for name, _ in await metrics(reader))
            assert [s.stop() for s in run.started] == [0, 0, 0], run.logs()
