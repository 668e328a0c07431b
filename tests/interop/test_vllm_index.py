"""`kvsi serve` subscribed to real vLLM workers: the API equals their block pools and events.

Three pods (pod-c with two DP ranks, its rank 1 on the pod's ports + 1, as vLLM offsets them)
serve agent sessions that share system prompts, move between pods, hit the prefix cache
(reported in mode "full") and outgrow the pools (evictions); then pod-b resets its prefix
cache. Both hash forms vLLM publishes are covered: 64-bit ints (its default) and the 32-byte
digests (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from tests.e2e.services import services, until
from tests.interop.fleet import VllmFleet, agents
from tests.interop.truth import caught_up, mismatches, session_residency, workers_view

pytestmark = [pytest.mark.interop, pytest.mark.e2e]

PODS = {"pod-a": 1, "pod-b": 1, "pod-c": 2}


async def live(client: httpx.AsyncClient, fleet: VllmFleet) -> bool:
    found = await workers_view(client)
    return all(found.get(key, {}).get("state") == "live" for key in fleet.workers)


@pytest.mark.parametrize("int_hashes", ["1", "0"], ids=["int-hashes", "bytes-hashes"])
async def test_each_worker_equals_its_block_pool_through_evictions_reuse_and_a_reset(
    int_hashes: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", int_hashes)
    with VllmFleet(PODS, workload=agents(3), num_blocks=128) as fleet:
        async with services() as run:
            service = run.start("kvsi", "memory", None, *fleet.serve_args())
            client = await run.client(service)
            await until(lambda: live(client, fleet), 30, "workers live", run)
            fleet.run(300)
            await until(lambda: caught_up(client, fleet.workers), 30, "caught up", run)
            assert await mismatches(client, fleet.workers) == []
            assert most_shared(fleet) > 1, "reuse reports gave shared prompts to sessions"
            assert most_spread(fleet) > 1, "sessions moved between workers"

            fleet.reset_prefix_cache("pod-b")
            fleet.run(100)
            await until(lambda: caught_up(client, fleet.workers), 30, "caught up again", run)
            assert await mismatches(client, fleet.workers) == []
    kinds = Counter(type(e).__name__ for w in fleet.workers.values() for e in w.published)
    assert kinds["BlockRemoved"] > 100, "the pools were small enough to evict"
    assert kinds["AllBlocksCleared"] == 1
    assert all(w.prefix_hits for w in fleet.workers.values())
    assert all(max(w.copies().values()) == 1 for w in fleet.workers.values()), (
        "one physical block per hash (test_vllm_limits covers two)"
    )


def most_shared(fleet: VllmFleet) -> int:
    """The most sessions one block belongs to on one worker, by the events."""
    counts: Counter[object] = Counter()
    for key, worker in fleet.workers.items():
        for blocks in session_residency(worker.published).values():
            counts.update((key, block) for block in blocks)
    return max(counts.values())


def most_spread(fleet: VllmFleet) -> int:
    """The most workers one session has blocks on, by the events."""
    workers: Counter[str] = Counter()
    for worker in fleet.workers.values():
        workers.update(session_residency(worker.published).keys())
    return max(workers.values())
