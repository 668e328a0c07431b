"""A run of batches longer than one apply.lua call (`CALL_MAX`): several calls, the next
planned and sent while Redis runs the one before, each landing only on the version the one
before leaves. Compared with the memory store through everything the read side can tell."""

from __future__ import annotations

from typing import Any

import pytest
import redis.exceptions

from kvsi.store.memory import MemoryStore
from kvsi.store.model import ApplyOutcome, Batch, EntriesRemoved, EntriesStored, StoreEvent
from kvsi.store.redis import RedisStore
from kvsi.store.redis.store import CALL_MAX
from kvsi.store.redis.transport import ClusterDirectScript
from tests.store.conftest import MakeStore
from tests.store.snapshots import A, snapshot

pytestmark = pytest.mark.redis

APPLIED = ApplyOutcome.APPLIED
DUPLICATE = ApplyOutcome.DUPLICATE


def _batches(count: int) -> list[Batch]:
    """Stores of four blocks into five sessions, each batch evicting two blocks stored three
    batches before (so every call removes what an earlier call stored)."""
    out = []
    for seq in range(count):
        events: list[StoreEvent] = [
            EntriesStored([seq * 4 + i + 1 for i in range(4)], "GPU", 0, f"s{seq % 5}")
        ]
        if seq >= 3:
            events.append(EntriesRemoved([(seq - 3) * 4 + 1, (seq - 3) * 4 + 2]))
        out.append(Batch(seq, 1.0 + seq, events))
    return out


async def _reference(batches: list[Batch]) -> MemoryStore:
    ref = MemoryStore()
    for batch in batches:
        await ref.apply(A, batch)
    return ref


def _watch(store: RedisStore) -> list[int]:
    """Count apply.lua calls; returns the most seen in flight at once, one entry per call."""
    call = store._apply_call
    in_flight: list[int] = []
    now = [0]

    async def counting(keys: list[str], args: list[Any]) -> Any:
        now[0] += 1
        in_flight.append(now[0])
        try:
            return await call(keys, args)
        finally:
            now[0] -= 1

    store._apply_call = counting
    return in_flight


def _queued(store: RedisStore) -> int:
    """Calls queued on the writer's connections and not written to them yet."""
    direct = store._direct
    if isinstance(direct, ClusterDirectScript):
        return sum(len(pipe.out) for pipe in direct._pipes.values())
    return 0 if direct._pipe is None else len(direct._pipe.out)


async def test_a_long_run_lands_as_calls(make_store: MakeStore, server_url: str) -> None:
    store, reader = await make_store(server_url), await make_store(server_url)
    batches = _batches(2 * CALL_MAX + 5)
    await store.apply(A, batches[0])  # the writer's mirror, loaded
    in_flight = _watch(store)
    assert await store.apply_many(A, batches[1:]) == [APPLIED] * (len(batches) - 1)
    assert len(in_flight) == 3, "one call per CALL_MAX batches"
    assert await snapshot(reader) == await snapshot(await _reference(batches))


async def test_each_call_is_sent_before_the_reply_to_the_one_before(
    make_store: MakeStore, server_url: str
) -> None:
    """Nothing waits between two calls of a run: the run's directory asserts go before its
    first call (a cluster) or in it (a standalone server)."""
    store = await make_store(server_url)
    batches = _batches(3 * CALL_MAX + 1)
    await store.apply(A, batches[0])
    in_flight = _watch(store)
    unwritten: list[int] = []  # per call, once planned: those before it not written yet
    inline = store._directories.inline

    def planned(*args: Any, **kwargs: Any) -> None:
        unwritten.append(_queued(store))
        inline(*args, **kwargs)

    store._directories.inline = planned  # type: ignore[method-assign]
    await store.apply_many(A, batches[1:])
    assert len(in_flight) == 3
    assert in_flight[:2] == [1, 2], "the second call went out before the first's reply"
    assert unwritten == [0, 0, 0], "each call written before the next is planned"


async def test_calls_after_another_writers_write_land_nothing_then_apply_one_by_one(
    make_store: MakeStore,
) -> None:
    """Another writer applied the run's first batch: the mirror's first call finds the
    version moved and writes nothing, and so does the second (it names the version the
    first would have left); the run then goes one batch at a time."""
    store, other, reader = await make_store(), await make_store(), await make_store()
    batches = _batches(2 * CALL_MAX + 1)
    await store.apply(A, batches[0])
    await other.apply(A, batches[1])
    in_flight = _watch(store)
    outcomes = await store.apply_many(A, batches[1:])
    assert outcomes == [DUPLICATE] + [APPLIED] * (len(batches) - 2)
    assert max(in_flight[:2]) == 2, "both calls were in flight"
    assert await snapshot(reader) == await snapshot(await _reference(batches))


@pytest.mark.parametrize("lands", [True, False], ids=["reply-lost", "never-sent"])
async def test_a_call_failing_in_flight_drops_the_mirror_and_the_retry_ends_alike(
    make_store: MakeStore, lands: bool
) -> None:
    """The second call's connection fails (after the first landed): whether it landed is
    unknown, so the mirror goes; the same run again applies what did not land."""
    store, reader = await make_store(), await make_store()
    batches = _batches(2 * CALL_MAX + 1)
    await store.apply(A, batches[0])
    call = store._apply_call
    sent = [0]

    async def failing_second(keys: list[str], args: list[Any]) -> Any:
        sent[0] += 1
        if sent[0] == 2:
            if lands:
                await call(keys, args)
            raise redis.exceptions.ConnectionError("connection reset")
        return await call(keys, args)

    store._apply_call = failing_second
    with pytest.raises(redis.exceptions.ConnectionError):
        await store.apply_many(A, batches[1:])
    assert store._writers[A].mirror is None
    store._apply_call = call
    again = await store.apply_many(A, batches[1:])
    second = [DUPLICATE if lands else APPLIED] * CALL_MAX
    assert again == [DUPLICATE] * CALL_MAX + second
    assert await snapshot(reader) == await snapshot(await _reference(batches))
