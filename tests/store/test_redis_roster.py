"""The central replicas' roster on a real Redis and a real Redis Cluster: beats record a
replica for its TTL on the server's clock, answer who is live with the epoch of that set
(greater after every change of it, and only then), and a leave is seen at once."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from redis.crc import key_slot

from kvsi.store.base import ReplicaRoster, RosterView
from kvsi.store.redis.layout import roster_key
from kvsi.store.redis.roster import RedisRoster, epoch_key
from kvsi.store.redis.store import open_client
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
    first = await a.beat("replica-b", 30)
    assert first.live == ["replica-b"]
    joined = await b.beat("replica-a", 30)
    assert joined.live == ["replica-a", "replica-b"]
    assert joined.epoch > first.epoch, "a replica joined: a new epoch"
    renewed = await a.beat("replica-b", 30)
    assert renewed == joined, "a renewal adds nobody and keeps the epoch"


async def test_a_replica_that_stops_beating_drops_out_after_its_ttl(
    make_roster: MakeRoster,
) -> None:
    roster = await make_roster()
    await roster.beat("lost", 0.3)
    both = await roster.beat("alive", 30)
    assert both.live == ["alive", "lost"]

    async def lost_gone() -> RosterView | None:
        view = await roster.beat("alive", 30)
        return view if view.live == ["alive"] else None

    alone = await until(lost_gone, within=10, what="the lost replica's record ran out")
    assert alone.epoch > both.epoch


async def test_a_replica_that_leaves_is_gone_at_once(make_roster: MakeRoster) -> None:
    roster = await make_roster()
    before = await roster.beat("leaving", 30)
    await roster.leave("leaving")
    after = await roster.beat("staying", 30)
    assert after.live == ["staying"]
    assert after.epoch > before.epoch


async def test_the_epoch_moves_on_past_a_join_and_a_leave_between_two_beats(
    make_roster: MakeRoster,
) -> None:
    """The live set is the same again, but a replica joined and left meanwhile (it may have
    written statuses at its epochs): the epoch is still a new one."""
    a, b = await make_roster(), await make_roster()
    before = await a.beat("a", 30)
    await b.beat("b", 30)
    await b.leave("b")
    after = await a.beat("a", 30)
    assert after.live == before.live == ["a"]
    assert after.epoch > before.epoch


async def test_the_epoch_survives_its_key_lost(
    make_roster: MakeRoster, server_url: str, prefix: str
) -> None:
    """The epoch key gone with the roster (a Redis emptied): the next set's epoch is still
    greater than every earlier one (the server's time in ms), and in the roster's slot."""
    roster = await make_roster()
    before = await roster.beat("a", 30)
    key = roster_key(prefix)
    assert key_slot(epoch_key(key).encode()) == key_slot(key.encode())
    client = open_client(f"{server_url}?prefix={prefix}")[0]
    try:
        await client.delete(key)
        await client.delete(epoch_key(key))
    finally:
        await client.aclose()
    after = await roster.beat("a", 30)
    assert after.live == ["a"]
    assert after.epoch > before.epoch


def test_the_epoch_key_shares_the_rosters_slot_with_or_without_a_tag() -> None:
    for roster in ("kvsi:replicas", "{fleet}:replicas", "a{b}c:replicas", "{x:replicas"):
        assert key_slot(epoch_key(roster).encode()) == key_slot(roster.encode()), roster


@pytest.mark.parametrize("prefix", ["{}x", "a}b"])
def test_a_prefix_no_key_can_share_the_rosters_slot_with_is_refused_in_one_line(
    prefix: str,
) -> None:
    with pytest.raises(StoreURLError, match="no hash tag"):
        open_roster(f"redis://127.0.0.1:1?prefix={prefix}")


async def test_fleets_with_other_prefixes_do_not_see_each_other(
    server_url: str, prefix: str
) -> None:
    one = RedisRoster.from_url(f"{server_url}?prefix={prefix}-one")
    two = RedisRoster.from_url(f"{server_url}?prefix={prefix}-two")
    try:
        await one.beat("r", 30)
        assert (await two.beat("s", 30)).live == ["s"]
    finally:
        await one.close()
        await two.close()


def test_the_memory_store_has_no_roster() -> None:
    with pytest.raises(StoreURLError, match="not shared"):
        open_roster("memory")


async def test_an_epoch_the_server_lost_is_moved_past_the_one_a_replica_saw(
    make_roster: MakeRoster, server_url: str, prefix: str
) -> None:
    """The server's epoch back below one a replica was answered, the live set unchanged (a
    failover to a replica that missed the last write): told what it saw, the roster takes a
    new epoch above it (whatever the server's clock reads), then keeps it; untold, it would
    answer the old epoch again for another set."""
    roster = await make_roster()
    await roster.beat("a", 30)
    seen = await roster.beat("b", 30)
    key = epoch_key(roster_key(prefix))
    client = open_client(f"{server_url}?prefix={prefix}")[0]
    try:
        await client.set(key, seen.epoch - 5_000)
        assert (await roster.beat("a", 30)).epoch == seen.epoch - 5_000, "untold: the old one"
        lifted = await roster.beat("a", 30, seen.epoch)
        assert lifted.live == seen.live == ["a", "b"]
        assert lifted.epoch > seen.epoch
        assert await roster.beat("b", 30, lifted.epoch) == lifted, "then kept"
        assert int(await client.get(key)) == lifted.epoch
        ahead = lifted.epoch + 60_000  # seen on a server whose clock was ahead of this one's
        assert (await roster.beat("a", 30, ahead)).epoch == ahead + 1
    finally:
        await client.aclose()
