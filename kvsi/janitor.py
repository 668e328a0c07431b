"""The janitor: keeps memory flat at a constant working set (DESIGN invariant 5), and the
garbage collector off the long-lived index.

Imports the store contract and the metrics. Session residencies idle for `session_idle`
are dropped, a bounded number per worker and pass (`store.model.idle`: blocks stay in the
worker's index); workers disconnected for longer than the grace time are removed with all
their data.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass

import structlog

from kvsi.metrics import RESIDENCIES_EXPIRED, SESSIONS_EXPIRED
from kvsi.store.base import IndexStore
from kvsi.store.model import Expired, WorkerKey, WorkerState

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Swept:
    """What one sweep removed."""

    expired: Expired
    workers: list[WorkerKey]


EXPIRY_LIMIT = 5_000
"""Residencies one pass drops per worker (`expire_sessions`' limit): what bounds one pass's
work (and its pauses of ingest and requests); a pass that leaves more is followed at once."""


async def sweep(
    store: IndexStore,
    *,
    now: float,
    session_idle: float,
    worker_grace: float,
    limit: int = EXPIRY_LIMIT,
    written_only: bool = False,
) -> Swept:
    """One pass. A worker counts as gone only while `disconnected`: a live but idle engine,
    or a configured publisher still connecting, keeps its index. `now` is compared with
    the engine times of the sessions' stores (the batches' `ts`). `written_only`: see
    `IndexWriter.expire_sessions` (an ingest-only process): it leaves gone workers to the
    processes sweeping the whole index too, as listing them reads every worker."""
    gone = [] if written_only else await _gone(store, now - worker_grace)
    for worker in gone:
        await store.remove_worker(worker)
        log.info("janitor.worker_removed", worker=str(worker), grace_seconds=worker_grace)
    expired = await store.expire_sessions(now - session_idle, limit, written_only=written_only)
    RESIDENCIES_EXPIRED.inc(expired.residencies)
    SESSIONS_EXPIRED.inc(expired.sessions)
    if expired.residencies:
        log.info(
            "janitor.sessions_expired",
            residencies=expired.residencies,
            sessions=expired.sessions,
            more=expired.more,
        )
    return Swept(expired=expired, workers=gone)


async def _gone(store: IndexStore, disconnected_before: float) -> list[WorkerKey]:
    """The workers disconnected since before `disconnected_before`. Listed (every worker's
    meta read: O(workers) on a shared store) only when some worker's state reads
    disconnected in the states every route reads, which a shared store keeps cached."""
    if WorkerState.DISCONNECTED not in (await store.worker_states()).values():
        return []
    return [
        WorkerKey(w.pod, w.dp_rank)
        for w in await store.list_workers()
        if w.status.state is WorkerState.DISCONNECTED and w.status.since < disconnected_before
    ]


def freeze_long_lived() -> None:
    """Collect the young generations, then move every survivor out of the collector's reach.

    The memory store holds millions of long-lived containers; each full collection walked
    them all and stalled the event loop for hundreds of milliseconds (the API's p99;
    bench/route_latency.py).
    Frozen objects are never scanned again. Collecting generations 0 and 1 first frees the
    fresh cyclic garbage (asyncio makes some); done every few seconds, almost nothing reaches
    the old generation unfrozen, so almost nothing leaks.
    """
    gc.collect(1)
    gc.freeze()


async def run_gc_freezer(interval: float) -> None:
    """`freeze_long_lived` every `interval` seconds until cancelled."""
    while True:
        await asyncio.sleep(interval)
        freeze_long_lived()


async def run_janitor(
    store: IndexStore,
    *,
    interval: float,
    session_idle: float,
    worker_grace: float,
    written_only: bool = False,
) -> None:
    """Sweep every `interval` seconds until cancelled, at once again after a pass that
    left idle residencies (`Expired.more`); a store outage skips a pass."""
    more = False
    while True:
        await asyncio.sleep(0 if more else interval)
        try:
            swept = await sweep(
                store,
                now=time.time(),
                session_idle=session_idle,
                worker_grace=worker_grace,
                written_only=written_only,
            )
            more = swept.expired.more
        except Exception as exc:  # an outage must not kill the janitor; the next pass retries
            more = False
            log.warning("janitor.pass_skipped", error=f"{type(exc).__name__}: {exc}")
