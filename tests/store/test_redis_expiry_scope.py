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
