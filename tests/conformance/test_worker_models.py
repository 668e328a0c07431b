"""A worker's model travels with its status: every backend keeps it, lists it, and forgets it."""

from __future__ import annotations

from kvsi.store.base import IndexStore
from kvsi.store.model import Batch, EntriesStored, WorkerKey, WorkerState, WorkerStatus

A = WorkerKey("pod-a", 0)
B = WorkerKey("pod-b", 1)
C = WorkerKey("pod-c", 0)
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


async def test_the_model_of_a_status_is_listed_and_read_per_worker(store: IndexStore) -> None:
    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 1.0, model=LLAMA))
    await store.set_status(B, WorkerStatus(WorkerState.LIVE, 1.0, model="qwen@2"))
    await store.apply(C, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))

    listed = {WorkerKey(w.pod, w.dp_rank): w.model for w in await store.list_workers()}

    assert listed == {A: LLAMA, B: "qwen@2", C: None}
    assert await store.worker_models() == listed


async def test_a_status_without_model_forgets_it_and_a_new_one_replaces_it(
    store: IndexStore,
) -> None:
    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 1.0, model=LLAMA))
    await store.set_status(A, WorkerStatus(WorkerState.DISCONNECTED, 2.0, "down"))
    assert await store.worker_models() == {A: None}

    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 3.0, model="mistral"))

    [view] = await store.list_workers()
    assert (view.model, view.status.state) == ("mistral", WorkerState.LIVE)


async def test_applying_batches_keeps_the_model_and_removal_drops_it(store: IndexStore) -> None:
    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 1.0, model=LLAMA))
    for seq in (0, 1, 1):  # a duplicate too
        await store.apply(A, Batch(seq, 1.0 + seq, [EntriesStored([seq], "GPU", 0, "s")]))
    await store.clear_worker(A)
    assert await store.worker_models() == {A: LLAMA}

    await store.remove_worker(A)

    assert await store.worker_models() == {}
