"""kvsi's Dynamo API against Dynamo's own indexer, both fed by vLLM's own publishers.

The peers tier (tests/peers/test_dynamo_differential.py) holds the two indexers to each
other on simulated publishers; here the events come from vLLM 0.33's KVCacheManager and
`ZmqEventPublisher`, configured as this project's manifests configure them (topic
`kv@<pod>@<model>`, both sockets bound on every interface, a DP rank on the pod's port +
rank). Instance 1 is pod-a (one rank), instance 2 pod-b (two ranks); both indexers get the
same `/register` calls. After agent sessions that share system prompts, hit the prefix cache
(re-announced in report mode "full") and outgrow the pools (evictions), 1,000 prompts drawn
from what the engines stored get equal `/query` and `/query_by_hash` answers from both; then
a fresh Dynamo indexer recovers from kvsi's `/dump` (`--peers`) and answers them as kvsi does.
"""

from __future__ import annotations

import asyncio
import random
from functools import partial

import httpx
import pytest

from tests.e2e.services import services
from tests.interop.engines import BLOCK_SIZE, MODEL, Turn, VllmWorker
from tests.interop.fleet import VllmFleet, WorkerKey, agents
from tests.peers.dynamo import (
    Asker,
    DynamoIndexer,
    answers_alike_before_and_after_recovery,
    require_peer,
)
from tests.waiting import until

pytestmark = [pytest.mark.interop, pytest.mark.e2e, pytest.mark.peers, pytest.mark.timeout(300)]

PODS = {"pod-a": 1, "pod-b": 2}
INSTANCES = {"pod-a": 1, "pod-b": 2}
"""Dynamo's instance id of each pod."""
TURNS = 300
PROMPTS = 1000


async def _subscribed(ask: Asker, bases: list[str], key: WorkerKey, worker: VllmWorker) -> None:
    """Until every indexer has joined the worker's stream (a SUB joins late and misses what
    came before): probe prompts until all hold one; then the worker resets its prefix cache
    (vLLM's AllBlocksCleared), so both start the traffic empty."""
    for attempt in range(50):
        tokens = [90_000 + attempt, INSTANCES[key[0]], key[1], *range(2 * BLOCK_SIZE - 3)]
        worker.submit(Turn(f"probe-{attempt}", tokens, [1]))
        worker.run_until_idle()
        for _ in range(20):
            if all(a["instances"] for a in await ask.answers(bases, tokens)):
                worker.reset_prefix_cache()
                await until(partial(ask.empty, bases, tokens), 10.0, f"{key} cleared")
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{key}: not subscribed everywhere")


async def _caught_up(ask: Asker, bases: list[str], fleet: VllmFleet) -> None:
    """Every indexer applied every event so far: a last prompt on each worker, stored after
    the rest, the same answer everywhere."""
    for (pod, rank), worker in fleet.workers.items():
        tokens = [80_000 + INSTANCES[pod], rank, *range(2 * BLOCK_SIZE - 2)]
        worker.submit(Turn(f"last-{pod}-{rank}", tokens, [1]))
        worker.run_until_idle()
        await until(partial(ask.agreed, bases, tokens), 20.0, f"{pod}/{rank} caught up")


def _stored_prefixes(fleet: VllmFleet) -> list[list[int]]:
    """Every block's whole prefix (its tokens after its parents'), from the stores the
    workers published: prompts an engine did hold at some time."""
    parent: dict[object, object] = {}
    tokens: dict[object, list[int]] = {}
    for worker in fleet.workers.values():
        for event in worker.published:
            if type(event).__name__ != "BlockStored":
                continue
            before = event.parent_block_hash
            for i, block in enumerate(event.block_hashes):
                parent.setdefault(block, before)
                tokens.setdefault(block, event.token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE])
                before = block
    prefixes = []
    for block in tokens:
        chain: list[int] = []
        at: object = block
        while at is not None and at in tokens:
            chain = tokens[at] + chain
            at = parent.get(at)
        prefixes.append(chain)
    return prefixes


def _prompts(rng: random.Random, stored: list[list[int]]) -> list[list[int]]:
    """Prompts a router could ask about: a stored prefix cut anywhere, with a new tail (often
    a partial last block), or noise."""
    out = []
    for _ in range(PROMPTS):
        tail = [rng.randrange(1, 30_000) for _ in range(rng.randrange(0, 2 * BLOCK_SIZE))]
        if rng.random() < 0.1:
            out.append(tail)
            continue
        prefix = rng.choice(stored)
        out.append(prefix[: rng.randrange(0, len(prefix) + 1)] + tail)
    return out


async def test_kvsi_answers_as_dynamos_indexer_on_vllms_own_events() -> None:
    peer = require_peer()
    rng = random.Random(33)
    with VllmFleet(PODS, workload=agents(15), num_blocks=128) as fleet:
        async with services() as run, httpx.AsyncClient(timeout=30.0) as client:
            ask = Asker(client, MODEL, BLOCK_SIZE)
            dynamo = DynamoIndexer(peer, run.workdir, "dynamo", "--threads", "2")
            try:
                kvsi = run.start("kvsi", "memory", None, env={"KVSI_DYNAMO_API": "true"})
                kvsi_base = f"{await kvsi.serving()}/dynamo"
                await dynamo.serving(client)
                bases = [kvsi_base, dynamo.url]
                for base in bases:
                    for (pod, rank), worker in fleet.workers.items():
                        await ask.register(base, INSTANCES[pod], rank, worker.endpoint)
                for key, worker in fleet.workers.items():
                    await _subscribed(ask, bases, key, worker)

                fleet.run(TURNS)
                await _caught_up(ask, bases, fleet)
                asked = _prompts(rng, _stored_prefixes(fleet))
                matched = await answers_alike_before_and_after_recovery(
                    ask, peer, run.workdir, kvsi_base, dynamo.url, asked
                )
                assert matched > PROMPTS // 4, "the prompts exercise the index"
            finally:
                dynamo.stop()
    removed = sum(
        type(e).__name__ == "BlockRemoved" for w in fleet.workers.values() for e in w.published
    )
    assert removed > 100, "the pools were small enough to evict"
    assert all(w.prefix_hits for w in fleet.workers.values())
