"""Redis coming back without its data, and reads right after an outage (issue 8, item 7:
"never a crash, never a silent hole"), with a real `kvsi serve` process and a private
redis-server without persistence, stopped and started on the same port.

- Redis restarts empty while the engines are idle: the service notices within its audit
  interval, rebuilds every worker from the publishers' replay buffers (from seq 0), and the
  index equals the engines again, each worker live with no batch lost.
- Redis restarts empty, then the engines publish: the same, from the first new batch.
- Redis restarts empty and the replay buffers no longer reach seq 0: each worker shows as
  degraded, saying the store lost its index and which seqs are gone; nothing is silent.
- With the index kept (persistence on), reads answer 200 as soon as the service says ready:
  the connections pooled before the outage are replaced, not failed once each.
"""

from __future__ import annotations

import pytest

from tests.e2e.services import (
    FAST_RETRY,
    PERSISTENT,
    all_live,
    burst,
    caught_up,
    metrics,
    outage_reported,
    per_worker,
    pods,
    ready,
    sidecar_on_redis,
    until,
)
from tests.e2e.truth import mismatches

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(120)]

FLEET = {"pods": 2, "sessions": 16, "seed": 5, "num_blocks": 512, "migrate_prob": 0.1}
RATE = 100.0
ENV = FAST_RETRY | {"KVSI_INDEX_AUDIT_SECONDS": "0.5"}


async def test_redis_back_empty_while_idle_is_rebuilt_from_replay() -> None:
    async with sidecar_on_redis(FLEET, ENV, 40, rate=RATE) as sidecar:
        redis, fleet, run, service, client = sidecar
        assert await mismatches(client, fleet) == []

        redis.stop()
        redis.start(redis.port)  # no persistence: the index is gone
        await until(lambda: all_live(client, fleet), 30, "pods listed and live again", run)
        await until(lambda: caught_up(client, fleet), 30, "caught up", run)
        assert await mismatches(client, fleet) == [], "rebuilt from the replay buffers"
        samples = await metrics(client)
        for pod, found in (await pods(client)).items():
            assert found["batches_lost"] == 0, found
            assert per_worker(samples, "kvsi_index_lost_total", pod) == 1
        assert "stream.index_lost" in service.output()
        assert service.stop() == 0, service.tail()


async def test_redis_back_empty_then_new_batches_leaves_no_silent_hole() -> None:
    # A long audit interval: the first new batch is what finds the loss.
    env = ENV | {"KVSI_INDEX_AUDIT_SECONDS": "600"}
    async with sidecar_on_redis(FLEET, env, 40, rate=RATE) as sidecar:
        redis, fleet, run, service, client = sidecar
        redis.stop()
        redis.start(redis.port)
        await fleet.run(RATE, max_batches=20)
        await until(lambda: caught_up(client, fleet), 30, "caught up", run)
        await until(lambda: all_live(client, fleet), 30, "live again", run)
        assert await mismatches(client, fleet) == [], "history rebuilt, new batches applied"
        samples = await metrics(client)
        for pod in fleet.pods:
            assert per_worker(samples, "kvsi_index_lost_total", pod) == 1
        assert service.stop() == 0, service.tail()


async def test_redis_back_empty_beyond_the_replay_buffer_shows_degraded() -> None:
    async with sidecar_on_redis(FLEET | {"buffer_steps": 10}, ENV, 40, rate=RATE) as sidecar:
        redis, fleet, run, service, client = sidecar
        redis.stop()
        redis.start(redis.port)

        async def degraded() -> dict[str, dict[str, object]] | None:
            found = await pods(client)
            if set(found) == set(fleet.pods) and all(
                p["state"] == "degraded" and "seqs 0.." in p["state_detail"] for p in found.values()
            ):  # (not while the rebuild still runs: "rebuilding it by replay")
                return found
            return None

        found = await until(degraded, 30, "every worker degraded", run)
        for pod, view in found.items():
            detail = str(view["state_detail"])
            assert "lost this worker's index" in detail, view
            first_kept = fleet.publisher(pod).next_seq - 10
            assert f"seqs 0..{first_kept - 1} lost" in detail, view
            assert view["batches_lost"] == first_kept, view
        assert service.stop() == 0, service.tail()


async def test_reads_answer_once_redis_is_back_and_the_service_says_ready() -> None:
    async with sidecar_on_redis(FLEET, ENV, 20, *PERSISTENT, rate=RATE) as sidecar:
        redis, fleet, run, service, client = sidecar
        assert await burst(client, fleet, 32) == []  # fills the service's connection pool

        redis.stop()
        await until(lambda: outage_reported(client, fleet, False), 20, "not ready", run)
        redis.start(redis.port)

        await until(lambda: ready(client), 30, "ready again", run)
        failed = [answer for _ in range(3) for answer in await burst(client, fleet, 32)]
        assert failed == [], f"{len(failed)} of 96 reads failed after ready: {failed[:3]}"
        assert service.stop() == 0, service.tail()
