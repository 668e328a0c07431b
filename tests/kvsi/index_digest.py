"""Prints what a memory store answers after a fixed simulated ingest, for
test_native_build.py to compare the native and interpreted builds (run as a script, with
PYTHONPATH naming the build to use)."""

from __future__ import annotations

import asyncio

import msgspec

from kvsi.simulator.engine import SimulatedEngine
from kvsi.simulator.workload import AgenticWorkload
from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, EntriesRemoved, EntriesStored, WorkerKey
from kvsi.subscriber import wire
from kvsi.subscriber.decode import ingest_decoder
from kvsi.version import core_build

WORKERS = [WorkerKey("pod-a", 0), WorkerKey("pod-b", 1)]


async def ingest(store: MemoryStore) -> list[str]:
    """Two engines small enough to evict, one restarted midway; a sessionless store and a
    removal of blocks held by several sessions. Returns the sessions' ids."""
    encoder, decoder = msgspec.msgpack.Encoder(), ingest_decoder()
    workload = AgenticWorkload(sessions=40, seed=3, system_prompts=3)
    engines = [SimulatedEngine(num_blocks=400, seed=i) for i in range(len(WORKERS))]
    for seq in range(300):
        for worker, engine in zip(WORKERS, engines, strict=True):
            request = workload.next_request()
            if request is None:
                break
            events = engine.run_request(request.session_id, request.token_ids)
            if seq == 150 and worker is WORKERS[1]:
                events = engine.reset() + events
            payload = encoder.encode(wire.KVEventBatch(ts=float(seq), events=events))
            await store.apply(worker, Batch(seq, float(seq), decoder.decode(payload).events))
    shared = [1, 2, 3]
    await store.apply(
        WORKERS[0],
        Batch(300, 300.0, [EntriesStored(shared, "GPU", 0, s) for s in ("x", "y", None)]),
    )
    await store.apply(WORKERS[0], Batch(301, 301.0, [EntriesRemoved([2, 2, 9, 3])]))
    page = await store.list_sessions(pod=None, limit=1000, cursor=None)
    return sorted(s.session_id for s in page.items)


async def digest() -> dict[str, object]:
    store = MemoryStore()
    sessions = await ingest(store)
    out: dict[str, object] = {"build": core_build(), "sessions": sessions}
    workers = msgspec.to_builtins(await store.list_workers())
    for view in workers:  # the wall clock's, not the index's
        del view["last_event_at"], view["status"]["since"]
    out["workers"] = workers
    out["losses"] = sorted((repr(k), v) for k, v in (await store.worker_losses()).items())
    for sid in sessions:
        out[f"session {sid}"] = await store.get_session(sid)
        out[f"blocks {sid}"] = await store.session_blocks(
            sid, pod=None, medium=None, limit=10_000, cursor=None
        )
    return out


if __name__ == "__main__":
    print(msgspec.json.encode(asyncio.run(digest()), order="deterministic").decode())
