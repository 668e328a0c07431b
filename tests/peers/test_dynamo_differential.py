"""kvsi's Dynamo API against Dynamo's own standalone indexer, on the same events.

Both subscribe, through the same `/register` calls, to the same simulated vLLM publishers:
instance 1 with two DP ranks, instance 2 with one, every engine offloading what its GPU
evicts to a CPU pool. After agent traffic with shared system prompts, evictions and
offloads, 1,000 random prompts get equal `/query` and `/query_by_hash` answers from both
(`scores`, the tiers, `longest_matched`); then a fresh Dynamo indexer recovers from kvsi's
`/dump` (`--peers`) and answers the same prompts as kvsi does.

What differs by design (docs/routers/dynamo.md, "Differences"): `frequencies` is compared
too (both empty); nothing else is left out.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import pytest

from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.subscriber.wire import AllBlocksCleared
from tests.e2e.services import services
from tests.peers.dynamo import Asker, DynamoIndexer, answers_alike_before_and_after_recovery
from tests.peers.traffic import BLOCK_SIZE, OffloadingEngine, Prompts
from tests.waiting import until

pytestmark = [pytest.mark.e2e, pytest.mark.peers, pytest.mark.timeout(240)]

MODEL = "agent-model"
RANKS = ((1, 0), (1, 1), (2, 0))
"""(instance_id, dp_rank) of each publisher."""
TURNS = 300
PROMPTS = 1000


@dataclass
class Rank:
    instance_id: int
    dp_rank: int
    publisher: SimulatedPublisher
    engine: OffloadingEngine


@pytest.fixture
async def ranks() -> AsyncIterator[list[Rank]]:
    out = []
    try:
        for instance_id, dp_rank in RANKS:
            publisher = SimulatedPublisher(
                "tcp://127.0.0.1:*",
                pod=f"engine-{instance_id}",
                model=MODEL,
                data_parallel_rank=dp_rank,
            )
            await publisher.start()
            out.append(Rank(instance_id, dp_rank, publisher, OffloadingEngine(24, 24)))
        yield out
    finally:
        for rank in out:
            await rank.publisher.close()


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


async def _subscribed(ask: Asker, bases: list[str], rank: Rank) -> None:
    """Until every indexer in `bases` has joined the rank's stream (a ZMQ SUB joins late and
    misses what came before): probe prompts, one after the other, until all hold one; then
    the rank's cache is cleared (AllBlocksCleared), so both start the traffic empty."""
    probe = [rank.instance_id * 1000 + rank.dp_rank, *range(2 * BLOCK_SIZE - 1)]
    for attempt in range(100):
        tokens = [attempt + 60_000, *probe]
        await rank.publisher.publish(OffloadingEngine(8, 8).run(tokens))
        for _ in range(10):
            answers = await ask.answers(bases, tokens)
            if all(a["instances"] for a in answers):
                await rank.publisher.publish([AllBlocksCleared()])
                await until(partial(ask.empty, bases, tokens), 10.0, f"{rank} cleared")
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"{rank}: not subscribed everywhere: {answers}")


async def _caught_up(ask: Asker, bases: list[str], ranks: list[Rank]) -> None:
    """Every indexer applied every event published so far: a last store on each rank, the
    same answer everywhere."""
    for rank in ranks:
        tokens = [70_000 + rank.instance_id, rank.dp_rank, *range(2 * BLOCK_SIZE - 2)]
        await rank.publisher.publish(rank.engine.run(tokens))
        await until(partial(ask.agreed, bases, tokens), 20.0, f"{rank} caught up")


async def _drive(ranks: list[Rank], prompts: Prompts, rng: random.Random) -> None:
    """TURNS requests spread over the ranks, each rank's events published in order."""
    for _ in range(TURNS):
        session, tokens = prompts.turn()
        rank = ranks[rng.randrange(len(ranks))]
        events = rank.engine.run(tokens, session)
        if events:
            await rank.publisher.publish(events)


async def test_kvsi_answers_as_dynamos_indexer_before_and_after_recovery_from_its_dump(
    peer: Path, ranks: list[Rank], workdir: Path, store_url: str
) -> None:
    rng = random.Random(15)
    prompts = Prompts(rng)
    async with services() as run, httpx.AsyncClient(timeout=30.0) as client:
        ask = Asker(client, MODEL, BLOCK_SIZE)
        dynamo = DynamoIndexer(peer, workdir, "dynamo", "--threads", "2")
        try:
            kvsi = run.start("kvsi", store_url, None, env={"KVSI_DYNAMO_API": "true"})
            kvsi_base = f"{await kvsi.serving()}/dynamo"
            await dynamo.serving(client)
            for base in (kvsi_base, dynamo.url):
                for rank in ranks:
                    await ask.register(
                        base, rank.instance_id, rank.dp_rank, rank.publisher.endpoint
                    )
            for rank in ranks:
                await _subscribed(ask, [kvsi_base, dynamo.url], rank)

            await _drive(ranks, prompts, rng)
            await _caught_up(ask, [kvsi_base, dynamo.url], ranks)
            asked = [prompts.query() for _ in range(PROMPTS)]
            matched = await answers_alike_before_and_after_recovery(
                ask, peer, workdir, kvsi_base, dynamo.url, asked
            )
            assert matched > PROMPTS // 3  # the prompts do exercise the index
        finally:
            dynamo.stop()
