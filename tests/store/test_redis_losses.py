"""The per-worker loss sums on Redis (meta `LOSS_FIELDS`): kept by the writer with every
write, lowered by another process's expiry, taken over by a writer that loads the worker,
and summed over the residencies for a worker written before the sums existed."""

from __future__ import annotations

import redis

from kvsi.store.model import Batch, EntriesRemoved, EntriesStored, WorkerKey, WorkerLosses
from kvsi.store.redis.layout import LOSS_FIELDS, WorkerKeys
from tests.store.conftest import MakeStore

A = WorkerKey("pod-a", 0)


def sized(hashes: list[int], session: str) -> EntriesStored:
    return EntriesStored(hashes, "GPU", 0, session, block_size=16)


async def hurt_two_sessions(writer_store: MakeStore) -> None:
    """On A: `s` holds 1 and lost 2, `t` held only 3 and lost it (an empty residency)."""
    writer = await writer_store()
    await writer.apply(A, Batch(0, 10.0, [sized([1, 2], "s"), sized([3], "t")]))
    await writer.apply(A, Batch(1, 10.0, [EntriesRemoved([2, 3])]))


async def test_the_writer_keeps_the_sums_in_the_workers_meta(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    await hurt_two_sessions(make_store)
    meta = WorkerKeys(prefix, A).meta
    assert raw.hmget(meta, LOSS_FIELDS) == [b"2", b"2", b"32"]
    api = await make_store()
    assert await api.worker_losses() == {A: WorkerLosses(2, 2, 32)}


async def test_another_processes_expiry_lowers_the_sums(make_store: MakeStore) -> None:
    await hurt_two_sessions(make_store)
    api = await make_store()
    swept = await api.expire_sessions(20.0, 100)  # not A's writer: expire.lua
    assert swept.residencies == 1, "only t holds no block"
    assert await api.worker_losses() == {A: WorkerLosses(1, 1, 16)}


async def test_a_writer_that_loads_the_worker_takes_the_sums_over(make_store: MakeStore) -> None:
    await hurt_two_sessions(make_store)
    successor = await make_store()
    await successor.apply(A, Batch(2, 11.0, [sized([1], "s"), EntriesRemoved([1])]))
    # s stored again (its 1 lost forgiven), then lost 1; t still lost 1.
    assert await successor.worker_losses() == {A: WorkerLosses(2, 2, 32)}


async def test_a_worker_without_the_sums_is_summed_over_its_residencies(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    await hurt_two_sessions(make_store)
    raw.hdel(WorkerKeys(prefix, A).meta, *LOSS_FIELDS)  # as written before they existed
    api = await make_store()
    assert await api.worker_losses() == {A: WorkerLosses(2, 2, 32)}
    await api.expire_sessions(20.0, 100)  # expire.lua leaves absent sums absent
    assert raw.hexists(WorkerKeys(prefix, A).meta, LOSS_FIELDS[0]) == 0
    assert await api.worker_losses() == {A: WorkerLosses(1, 1, 16)}


async def test_expiry_lowers_the_sums_of_blocks_of_unknown_size(make_store: MakeStore) -> None:
    writer = await make_store()
    await writer.apply(A, Batch(0, 10.0, [EntriesStored([1], "GPU", 0, "s"), EntriesRemoved([1])]))
    api = await make_store()
    assert await api.worker_losses() == {A: WorkerLosses(1, 1, 0)}
    assert (await api.expire_sessions(20.0, 100)).residencies == 1
    assert await api.worker_losses() == {A: WorkerLosses(0, 0, 0)}
