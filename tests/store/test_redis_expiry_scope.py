"""Who sweeps what on Redis: an ingest-only process (`written_only`) expires only the workers
it writes and reads no other worker; a full pass (the API replicas') sweeps the rest."""

from __future__ import annotations

from kvsi.store.model import Batch, EntriesRemoved, EntriesStored, WorkerKey
from tests.store.conftest import MakeStore

A = WorkerKey("pod-a", 0)
B = WorkerKey("pod-b", 0)


async def test_a_written_only_pass_touches_only_the_workers_this_process_writes(
    make_store: MakeStore,
) -> None:
    sidecar_a, sidecar_b, api = await make_store(), await make_store(), await make_store()
    for writer, worker in ((sidecar_a, A), (sidecar_b, B)):
        await writer.apply(
            worker, Batch(0, 10.0, [EntriesStored([1], "GPU", 0, f"held-{worker.pod}")])
        )
        await writer.apply(
            worker,
            Batch(
                1, 10.0, [EntriesStored([2], "GPU", 0, f"empty-{worker.pod}"), EntriesRemoved([2])]
            ),
        )

    done = await sidecar_a.expire_sessions(20.0, 100, written_only=True)

    assert (done.residencies, done.sessions, done.more) == (2, 0, False)
    assert await api.get_session("held-pod-a") is None
    assert await api.get_session("empty-pod-a") is None
    assert await api.get_session("held-pod-b") is not None, "not its worker"
    assert await api.get_session("empty-pod-b") is not None, "not its worker"

    swept = await api.expire_sessions(20.0, 100)
    assert (swept.residencies, swept.sessions) == (1, 1)  # B's block-less residency
    assert await api.get_session("empty-pod-b") is None
    assert await api.get_session("held-pod-b") is not None, "left to B's writer"


async def test_a_released_worker_is_swept_by_its_new_writer_and_no_longer_by_the_old(
    make_store: MakeStore,
) -> None:
    """A central replica hands a worker over: the old one releases it (its mirror goes), so
    its written-only passes leave it to the new owner, which then writes and sweeps it."""
    old, new, api = await make_store(), await make_store(), await make_store()
    await old.apply(A, Batch(0, 10.0, [EntriesStored([1], "GPU", 0, "first")]))
    await old.release(A)
    untouched = await old.expire_sessions(20.0, 100, written_only=True)
    assert untouched.residencies == 0, "released: not the old writer's to sweep"
    assert await api.get_session("first") is not None

    await new.apply(A, Batch(1, 10.0, [EntriesStored([2], "GPU", 0, "second")]))
    swept = await new.expire_sessions(20.0, 100, written_only=True)
    assert swept.residencies == 2
    assert await api.get_session("first") is None and await api.get_session("second") is None

    await old.apply(A, Batch(2, 30.0, [EntriesStored([3], "GPU", 0, "back")]))
    view = await api.get_session("back")
    assert view is not None and view.total_blocks == 1, "written afresh"
    assert (await old.fence(A)) is not None
