"""A central replica's beat against a real redis-server: it sees the others come, keeps its
view through a short store outage, claims nothing once its record has run out, and rejoins
when the store is back."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from kvsi.replicas import ReplicaBeat
from kvsi.store.redis.layout import DEFAULT_PREFIX, roster_key
from kvsi.store.redis.roster import RedisRoster, epoch_key
from kvsi.store.redis.store import open_client
from tests.redis_servers import RedisServer, require
from tests.waiting import until

pytestmark = pytest.mark.redis

BEAT, TTL = 0.05, 3.0


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A private server this test stops and starts again on the same port."""
    require("redis-server")
    own = RedisServer()
    own.start()
    try:
        yield own
    finally:
        own.remove()


async def beat_until(beat: ReplicaBeat, what: str) -> tuple[str, ...]:
    async def changed() -> tuple[str, ...] | None:
        view = await beat.beat_if_due(time.monotonic())
        return None if view is None else (view or ("<empty>",))

    return await until(changed, within=30, what=what, every=BEAT)


async def test_a_replica_keeps_its_view_while_its_record_lasts_then_claims_nothing(
    server: RedisServer,
) -> None:
    beat = ReplicaBeat(RedisRoster.from_url(server.url), "me", BEAT, TTL)
    other = RedisRoster.from_url(server.url)
    try:
        assert await beat_until(beat, "first view") == ("me",)
        await other.beat("other", 30)
        assert await beat_until(beat, "the other seen") == ("me", "other")

        port = server.port
        server.stop()
        assert await beat.beat_if_due(time.monotonic() + BEAT) is None, "kept while it lasts"
        assert await beat_until(beat, "the record ran out") == ("<empty>",)

        server.start(port)
        assert await beat_until(beat, "rejoined") == ("me",), "the other's record is gone too"
    finally:
        await other.close()
        await beat.roster.close()


async def test_a_replica_moves_the_epoch_on_past_one_the_server_lost(server: RedisServer) -> None:
    """The roster's epoch set back below the one this replica was answered (a failover to a
    replica behind, whose clock is behind too): its next beat, the live set unchanged, takes
    a new epoch above what it saw, so statuses it fenced at the old one are not refused,
    nor answered twice."""
    roster = RedisRoster.from_url(server.url)
    beat = ReplicaBeat(roster, "me", BEAT, TTL)
    client = open_client(server.url)[0]
    key = epoch_key(roster_key(DEFAULT_PREFIX))
    try:
        assert await beat_until(beat, "first view") == ("me",)
        first = beat.epoch
        assert first is not None
        await client.set(key, first + 60_000)  # as a server whose clock is ahead gave it
        assert await beat.beat_if_due(time.monotonic() + BEAT) is None, "the same view"
        seen = beat.epoch
        assert seen == first + 60_000
        await client.set(key, first - 5_000)
        assert await beat.beat_if_due(time.monotonic() + 2 * BEAT) is None, "the same view"
        assert beat.epoch == seen + 1
    finally:
        await client.aclose()
        await roster.close()
