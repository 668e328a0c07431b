"""The central replicas' roster on a real Redis and a real Redis Cluster: beats record a
replica for its TTL on the server's clock, answer who is live, and a leave is seen at once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from kvsi.store.base import ReplicaRoster
from kvsi.store.redis.roster import RedisRoster
from kvsi.store.select import StoreURLError, open_roster
from tests.waiting import until

MakeRoster = Callable[[], Awaitable[ReplicaRoster]]


@pytest.fixture
async def make_roster(server_url: str, prefix: str) -> AsyncIterator[MakeRoster]:
    """Rosters of one fleet (one prefix) on the standalone server, then on the cluster."""
    made: list[ReplicaRoster] = []

    async def make() -> ReplicaRoster:
        made.append(open_roster(f"{server_url}?prefix={prefix}"))
        return made[-1]

    yield make
    for roster in made:
        await roster.close()


async def test_each_beat_answers_the_live_replicas_in_order(make_roster: MakeRoster) -> None:
    a, b = await make_roster(), await make_roster()
    assert await a.beat("replica-b", 30) == ["replica-b"]
    assert await b.beat("replica-a", 30) == ["replica-a", "replica-b"]
    assert await a.beat("replica-b", 30) == ["replica-a", "replica-b"], "a renewal adds nobody"


async def test_a_replica_that_stops_beating_drops_out_after_its_ttl(
    make_roster: MakeRoster,
) -> None:
    roster = await make_roster()
    await roster.beat("lost", 0.3)
    assert await roster.beat("alive", 30) == ["alive", "lost"]

    async def lost_gone() -> bool:
        return await roster.beat("alive", 30) == ["alive"]

    await until(lost_gone, within=10, what="the lost replica's record ran out")


async def test_a_replica_that_leaves_is_gone_at_once(make_roster: MakeRoster) -> None:
    roster = await make_roster()
    await roster.beat("leaving", 30)
    await roster.leave("leaving")
    assert await roster.beat("staying", 30) == ["staying"]


async def test_fleets_with_other_prefixes_do_not_see_each_other(
    server_url: str, prefix: str
) -> None:
    one = RedisRoster.from_url(f"{server_url}?prefix={prefix}-one")
    two = RedisRoster.from_url(f"{server_url}?prefix={prefix}-two")
    try:
        await one.beat("r", 30)
        assert await two.beat("s", 30) == ["s"]
    finally:
        await one.close()
        await two.close()


def test_the_memory_store_has_no_roster() -> None:
    with pytest.raises(StoreURLError, match="not shared"):
        open_roster("memory")
