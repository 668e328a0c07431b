"""`worker_states`, the per-request read of every worker's state, on every backend."""

from __future__ import annotations

from kvsi.store.base import IndexStore
from kvsi.store.model import Batch, EntriesStored, WorkerKey, WorkerState, WorkerStatus
from tests.waiting import eventually

A = WorkerKey("pod-a", 0)
B = WorkerKey("pod-b", 1)
C = WorkerKey("pod-c", 0)


async def states_from_list_workers(store: IndexStore) -> dict[WorkerKey, WorkerState]:
    return {WorkerKey(w.pod, w.dp_rank): w.status.state for w in await store.list_workers()}


async def test_worker_states_name_every_known_worker_as_list_workers_does(
    store: IndexStore,
) -> None:
    assert await store.worker_states() == {}
    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 1.0))
    await store.set_status(B, WorkerStatus(WorkerState.DEGRADED, 2.0, "gap"))
    await store.apply(C, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))

    states = await store.worker_states()

    assert states == {A: WorkerState.LIVE, B: WorkerState.DEGRADED, C: WorkerState.CONNECTING}
    assert states == await states_from_list_workers(store)


async def test_a_removed_worker_leaves_the_states_at_once(store: IndexStore) -> None:
    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 1.0))
    await store.set_status(B, WorkerStatus(WorkerState.LIVE, 1.0))
    assert set(await store.worker_states()) == {A, B}

    await store.remove_worker(B)

    assert await store.worker_states() == {A: WorkerState.LIVE}


async def test_a_state_change_shows_within_the_registry_cache_age(store: IndexStore) -> None:
    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 1.0))
    assert await store.worker_states() == {A: WorkerState.LIVE}

    await store.set_status(A, WorkerStatus(WorkerState.DISCONNECTED, 2.0))

    async def shows() -> bool:
        return await store.worker_states() == {A: WorkerState.DISCONNECTED}

    await eventually(shows, within=5.0)  # Redis: registry_ttl (1 s here); memory: at once


async def test_list_workers_refreshes_the_states(store: IndexStore) -> None:
    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 1.0))
    assert await store.worker_states() == {A: WorkerState.LIVE}
    await store.set_status(A, WorkerStatus(WorkerState.DEGRADED, 2.0, "gap"))

    await store.list_workers()

    assert await store.worker_states() == {A: WorkerState.DEGRADED}


async def test_the_same_mapping_until_a_state_changes_or_a_worker_comes_or_goes(
    store: IndexStore,
) -> None:
    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 1.0))
    await store.set_status(B, WorkerStatus(WorkerState.LIVE, 1.0))
    first = await store.worker_states()
    snapshot = dict(first)

    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 2.0, "same state, later"))
    await store.apply(A, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))
    assert await store.worker_states() is first

    await store.set_status(A, WorkerStatus(WorkerState.DEGRADED, 3.0, "gap"))
    await store.list_workers()  # Redis: the states read again at once
    changed = await store.worker_states()
    await store.apply(C, Batch(0, 1.0, [EntriesStored([2], "GPU", 0, "t")]))
    await store.list_workers()
    grown = await store.worker_states()
    await store.remove_worker(C)
    shrunk = await store.worker_states()

    assert first == snapshot, "a mapping once answered is never changed"
    assert changed == {A: WorkerState.DEGRADED, B: WorkerState.LIVE}
    assert grown == {**changed, C: WorkerState.CONNECTING} and shrunk == changed
    assert len({id(first), id(changed), id(grown), id(shrunk)}) == 4
