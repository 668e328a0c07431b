"""The embedded index store: the index core (store/core.py) per worker, plus the reads.

Imports neither zmq, fastapi nor redis. Each worker is a `WorkerIndex`; this module adds
what spans workers (sessions, removed workers' sessions, Dynamo registrations), the worker
status, the change feed's hub, and every read.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import ClassVar, Final, cast

from mypy_extensions import mypyc_attr

from kvsi.store.core import WorkerIndex, merged_removals, stored_fields
from kvsi.store.feed import FeedHub, FeedRecord, WorkerChange
from kvsi.store.first_blocks import FirstBlocks
from kvsi.store.model import (
    REMOVED,
    STORED,
    ApplyOutcome,
    Batch,
    EntriesRemoved,
    EntriesStored,
    Expired,
    Fence,
    Frontier,
    Hash,
    IndexLostError,
    Page,
    SessionOnWorker,
    SessionSummary,
    SessionView,
    StoreEvent,
    WorkerKey,
    WorkerLosses,
    WorkerState,
    WorkerStatus,
    WorkerView,
    advance,
    decide,
    fell_behind,
    idle,
    reprefill_tokens,
)
from kvsi.store.paging import SessionOrder, page_hashes, page_sessions
from kvsi.store.records import Part, Residency
from kvsi.store.registry import DynamoInstance
from kvsi.store.tokens import Edge

EXPIRE_CHUNK = 1_000
"""Residencies `expire_sessions` drops between two yields to the event loop."""

FIRST_BLOCKS_PER_PASS = 50_000
"""First blocks each `expire_sessions` pass looks at (a walk of the directory spans passes),
EXPIRE_CHUNK at a time between two yields."""


_DUPLICATE: Final = ApplyOutcome.DUPLICATE
_PREVIOUS_ENGINE: Final = ApplyOutcome.PREVIOUS_ENGINE
_RESTARTED: Final = ApplyOutcome.RESTARTED
_now: Final = time.time
"""Statics of the compiled module, for `apply_now`: an enum member or a module's function
is otherwise looked up by name on every batch."""


class _Session:
    """A session across workers; kept after its entries are gone until it ages out."""

    __slots__ = ("ended", "session_id", "workers")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.workers: dict[WorkerKey, _Residency] = {}
        self.ended = 0.0
        """The latest last store of the residencies it no longer has (dropped, or their
        worker removed)."""

    def last_seen(self) -> float:
        """Its latest store on any worker: read from its residencies, so a store writes
        none of this (one object fewer per store on ingest). O(its residencies)."""
        seen = self.ended
        for res in self.workers.values():
            if res.last_store > seen:
                seen = res.last_store
        return seen

    def end(self, worker: WorkerKey) -> None:
        """Its residency on `worker` ends; its last store still counts."""
        res = self.workers.pop(worker)
        if res.last_store > self.ended:
            self.ended = res.last_store


class _Residency(Residency):
    """A core residency that knows its session (the cross-worker view reads through it)."""

    __slots__ = ("session",)

    def __init__(self, session: _Session) -> None:
        super().__init__(session.session_id)
        self.session = session

    def view(self, key: WorkerKey, index: WorkerIndex[Part, _Residency]) -> SessionOnWorker:
        by_medium: dict[str, int] = {}
        for pid, n in self.counts().items():
            medium = index.by_pid[pid].medium
            by_medium[medium] = by_medium.get(medium, 0) + n
        return SessionOnWorker(
            pod=key.pod,
            dp_rank=key.dp_rank,
            blocks=self.total,
            by_medium=by_medium,
            last_seen=self.last_store,
            lost_blocks=self.lost,
            reprefill_tokens=reprefill_tokens(self.lost, self.block_size),
            frontier=None if self.frontier is None else Frontier(self.frontier, self.position),
        )


class _Worker:
    """A worker: its index (the core) and what the memory store keeps beside it."""

    __slots__ = ("index", "key", "last_event_at", "status", "status_epoch")

    def __init__(self, key: WorkerKey, new_residency: Callable[[str], _Residency]) -> None:
        self.key = key
        self.index: WorkerIndex[Part, _Residency] = WorkerIndex(Part, new_residency)
        self.status = WorkerStatus(since=time.time())
        self.status_epoch = 0
        """The epoch of the last fenced status (`IndexWriter.set_status`)."""
        self.last_event_at: float | None = None


@mypyc_attr(allow_interpreted_subclasses=True)  # test doubles and wrappers extend it
class MemoryStore:
    """IndexStore in process memory; the embedded default."""

    applies_inline: ClassVar[bool] = True

    def __init__(self, feed: FeedHub | None = None) -> None:
        self._workers: dict[WorkerKey, _Worker] = {}
        self._states: dict[WorkerKey, WorkerState] | None = None
        """`worker_states`' answer, until a worker's state changes or a worker comes or goes."""
        self._sessions: dict[str, _Session] = {}
        self._feed = feed if feed is not None else FeedHub()
        self._instances: dict[tuple[int, int], DynamoInstance] = {}
        """Dynamo registrations by (instance_id, dp_rank)."""
        self._retired: list[tuple[float, str]] = []
        """Heap of (last_seen, id) of sessions left with no residency (their workers removed,
        or dropped while a removed worker's record is younger): forgotten once idle."""
        self.expire_chunk = EXPIRE_CHUNK
        self.first_blocks_per_pass = FIRST_BLOCKS_PER_PASS
        self._firsts = FirstBlocks()
        """Which workers may hold each prompt's first block (`match_prefix` reads those)."""

    # -- write side ---------------------------------------------------------------------

    async def apply(
        self, worker: WorkerKey, batch: Batch, expect: Fence | None = None
    ) -> ApplyOutcome:
        return self.apply_now(worker, batch, expect)

    async def apply_many(
        self, worker: WorkerKey, batches: Sequence[Batch], expect: Fence | None = None
    ) -> list[ApplyOutcome]:
        return [self.apply_now(worker, batch, expect) for batch in batches]

    def apply_now(
        self, worker: WorkerKey, batch: Batch, expect: Fence | None = None
    ) -> ApplyOutcome:
        """`apply` without the coroutine, for benchmarks and the in-process fast path."""
        if expect is not None:
            known = self._workers.get(worker)
            stored = None if known is None else known.index.fence
            if fell_behind(stored, expect):
                raise IndexLostError(worker, None if stored is None else stored.seq, expect)
        w = self._worker(worker)
        index = w.index
        seq, ts = batch.seq, batch.ts
        outcome = decide(index.fence, seq, ts)
        if outcome is _DUPLICATE or outcome is _PREVIOUS_ENGINE:
            return outcome
        index.begin()
        try:
            if outcome is _RESTARTED:
                index.clear()
            self._apply_events(w, batch.events, ts)
        except BaseException:
            # What it changed before raising is fed all the same: the feed's readers follow
            # the index (ingest gives such a batch up and goes on with the next).
            self._publish(w, ts, losses=True)
            raise
        index.fence = advance(index.fence, outcome, seq, ts)
        w.last_event_at = _now()
        self._publish(w, ts, losses=True)
        return outcome

    def _apply_events(self, w: _Worker, events: list[StoreEvent], ts: float) -> None:
        index = w.index
        note_first = self._firsts.note
        key = w.key
        for event in merged_removals(events):
            kind = event.kind
            if kind == STORED:
                fields = stored_fields(cast(EntriesStored, event))
                index.store(fields, ts)
                hashes, _, _, _, parent, _, tokens = fields
                if tokens:
                    index.link(fields)
                if parent is None and hashes:
                    note_first(hashes[0], key)
            elif kind == REMOVED:
                removed = cast(EntriesRemoved, event)
                part = index.part(removed.medium, removed.group_idx)
                if part is not None:
                    if part.pending:
                        index.confirm(part, removed.block_hashes)
                    index.remove(part, removed.block_hashes, lost=True)
            else:
                index.clear()

    def _publish(self, w: _Worker, ts: float, *, losses: bool) -> None:
        """The change feed's record of the write just applied to `w`, if it changed a
        residency (`losses`: its removals are losses, see `FeedRecord.losses`)."""
        rows = w.index.rows()
        if rows:
            key = w.key
            self._feed.publish(FeedRecord(key.pod, key.dp_rank, ts, rows, losses=losses))

    def _new_residency(self, key: WorkerKey, session_id: str) -> _Residency:
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = _Session(session_id)
        res = session.workers[key] = _Residency(session)
        return res

    def _worker(self, key: WorkerKey) -> _Worker:
        w = self._workers.get(key)
        if w is None:
            w = self._workers[key] = _Worker(key, partial(self._new_residency, key))
            self._states = None
        return w

    async def fence(self, worker: WorkerKey) -> Fence | None:
        w = self._workers.get(worker)
        return w.index.fence if w else None

    async def set_status(
        self, worker: WorkerKey, status: WorkerStatus, epoch: int | None = None
    ) -> bool:
        w = self._worker(worker)
        if epoch is not None:
            if epoch < w.status_epoch:
                return False
            w.status_epoch = epoch
        changed = (w.status.state, w.status.detail) != (status.state, status.detail)
        if w.status.state != status.state:
            self._states = None
        w.status = status
        if changed:
            change = WorkerChange(
                worker.pod, worker.dp_rank, status.state, status.since, status.detail
            )
            record = FeedRecord(worker.pod, worker.dp_rank, status.since, state=change)
            self._feed.publish(record)
        return True

    async def change_feed(self) -> FeedHub:
        return self._feed

    async def mark_unconfirmed(self, worker: WorkerKey) -> int:
        w = self._workers.get(worker)
        return 0 if w is None else w.index.mark_unconfirmed()

    async def drop_unconfirmed(self, worker: WorkerKey) -> int:
        w = self._workers.get(worker)
        if w is None:
            return 0
        index = w.index
        index.begin()
        dropped = 0
        for part, pending in index.take_unconfirmed():
            dropped += len(pending)
            index.remove(part, pending, lost=False)
        self._publish(w, _engine_time(w), losses=False)
        return dropped

    async def clear_worker(self, worker: WorkerKey) -> None:
        w = self._workers.get(worker)
        if w is not None:
            w.index.begin()
            w.index.clear()
            self._publish(w, _engine_time(w), losses=True)

    async def release(self, worker: WorkerKey) -> None:
        """Nothing to drop: this process is the index."""

    async def remove_worker(self, worker: WorkerKey) -> None:
        """The worker's residencies end (their rows in the change feed, not as losses); a
        session left with no residency is kept as retired until it is idle."""
        w = self._workers.pop(worker, None)
        if w is None:
            return
        self._states = None
        w.index.begin()
        w.index.clear()
        for res in w.index.residencies.values():
            session = res.session
            session.end(worker)
            if not session.workers:
                heapq.heappush(self._retired, (session.ended, session.session_id))
        self._publish(w, _engine_time(w), losses=False)

    async def expire_sessions(
        self, older_than: float, limit: int, *, written_only: bool = False
    ) -> Expired:
        """Per worker, its residencies from the least recently stored while `idle`, at most
        `limit`, then at most `limit` sessions of removed workers; a yield to the event loop
        every EXPIRE_CHUNK drops. O(dropped residencies' entries + limit), plus a walk of
        the worker's entries per EXPIRE_CHUNK drops (a residency keeps counts, not hashes)."""
        residencies = sessions = 0
        more = False
        for w in list(self._workers.values()):
            due = w.index.idle(older_than, limit)
            more = more or len(due) > limit
            del due[limit:]
            chunk = self.expire_chunk
            for start in range(0, len(due), chunk):
                if self._workers.get(w.key) is not w:
                    break  # removed during a pause
                dropped, forgotten = self._drop(w, due[start : start + chunk], older_than)
                residencies += dropped
                sessions += forgotten
                await asyncio.sleep(0)
        retired = self._retired
        looked = 0
        while retired and retired[0][0] < older_than and looked < limit:
            _, sid = heapq.heappop(retired)
            looked += 1
            session = self._sessions.get(sid)
            if session is not None and not session.workers and idle(session.ended, older_than):
                del self._sessions[sid]
                sessions += 1
        more = more or bool(retired and retired[0][0] < older_than)
        await self._sweep_firsts()
        return Expired(residencies, sessions, more)

    async def _sweep_firsts(self) -> None:
        """The next FIRST_BLOCKS_PER_PASS blocks of the first-block directory's walk."""
        looked = 0
        while looked < self.first_blocks_per_pass and self._firsts:
            looked += self._firsts.sweep(self._holds, self.expire_chunk)
            await asyncio.sleep(0)

    def _drop(self, w: _Worker, due: list[_Residency], older_than: float) -> tuple[int, int]:
        """Drop residencies of `w` still idle (one stored during a pause stays): their
        entries stay on the worker (`WorkerIndex.drop`); the change feed gets their removed
        entries as for the stale policy's drops. Returns (residencies dropped, sessions
        forgotten)."""
        index = w.index
        due = [
            r
            for r in due
            if index.residencies.get(r.session_id) is r and idle(r.last_store, older_than)
        ]
        holding = index.holdings([r.session_id for r in due if r.total])
        index.begin()
        forgotten = 0
        for res in due:
            session = res.session
            sid = session.session_id
            index.drop(res, holding.get(sid, {}))
            session.end(w.key)
            if not session.workers:
                if idle(session.ended, older_than):
                    del self._sessions[sid]
                    forgotten += 1
                else:  # a removed worker saw it later: it stays until that ages out
                    heapq.heappush(self._retired, (session.ended, sid))
        self._publish(w, _engine_time(w), losses=False)
        return len(due), forgotten

    # -- read side ----------------------------------------------------------------------

    async def get_session(self, session_id: str) -> SessionView | None:
        session = self._sessions.get(session_id)
        if session is None:
            return None
        workers = [
            res.view(key, self._workers[key].index)
            for key, res in session.workers.items()
            if res.total or res.lost
        ]
        workers.sort(key=lambda s: (-s.blocks, s.pod, s.dp_rank))
        return SessionView(
            session_id=session_id,
            total_blocks=sum(s.blocks for s in workers),
            last_seen=session.last_seen(),
            workers=workers,
        )

    async def session_blocks(
        self,
        session_id: str,
        *,
        pod: str | None,
        medium: str | None,
        limit: int,
        cursor: str | None,
    ) -> Page[Hash] | None:
        session = self._sessions.get(session_id)
        if session is None:
            return None
        hashes: set[Hash] = set()
        for key, res in session.workers.items():
            if (pod is None or key.pod == pod) and res.total:
                index = self._workers[key].index
                for pid, held in index.holdings([session_id])[session_id].items():
                    if medium is None or index.by_pid[pid].medium == medium:
                        hashes.update(held)
        return page_hashes(hashes, limit, cursor)

    async def list_sessions(
        self,
        *,
        pod: str | None,
        limit: int,
        cursor: str | None,
        order: SessionOrder = "last_seen",
        prefix: str | None = None,
    ) -> Page[SessionSummary]:
        held_only = pod is not None or order == "blocks"
        return page_sessions(self._summaries(pod, prefix, held_only), limit, cursor, order)

    def _summaries(
        self, pod: str | None, prefix: str | None, held_only: bool
    ) -> Iterator[SessionSummary]:
        for sid, session in self._sessions.items():
            if prefix is not None and not sid.startswith(prefix):
                continue
            counts = [
                res.total for key, res in session.workers.items() if pod is None or key.pod == pod
            ]
            blocks = sum(counts)
            if held_only and not blocks:
                continue
            yield SessionSummary(
                session_id=sid,
                blocks=blocks,
                workers=sum(1 for c in counts if c),
                last_seen=session.last_seen(),
            )

    async def list_workers(self) -> list[WorkerView]:
        return [
            WorkerView(
                pod=w.key.pod,
                dp_rank=w.key.dp_rank,
                blocks=w.index.entries(),
                sessions=w.index.active,
                last_seq=w.index.fence.seq if w.index.fence else None,
                last_event_at=w.last_event_at,
                status=w.status,
                unconfirmed=w.index.unconfirmed(),
            )
            for _, w in sorted(self._workers.items())
        ]

    async def worker_losses(self) -> dict[WorkerKey, WorkerLosses]:
        """Each worker's sums, kept by its index as residencies change: O(workers)."""
        return {key: w.index.losses() for key, w in self._workers.items()}

    async def worker_states(self) -> Mapping[WorkerKey, WorkerState]:
        """Exact: the workers' states as they are, made anew after a change (`_states`)."""
        if self._states is None:
            self._states = {key: w.status.state for key, w in self._workers.items()}
        return self._states

    async def worker_blocks(
        self, pod: str, *, dp_rank: int | None, medium: str | None, limit: int, cursor: str | None
    ) -> Page[Hash] | None:
        workers = [
            w
            for key, w in self._workers.items()
            if key.pod == pod and (dp_rank is None or key.dp_rank == dp_rank)
        ]
        if not workers:
            return None
        hashes: set[Hash] = set()
        for w in workers:
            for part in w.index.by_pid.values():
                if medium is None or part.medium == medium:
                    hashes.update(part.holders)
        return page_hashes(hashes, limit, cursor)

    async def match_prefix(
        self, hashes: Sequence[Hash], workers: Collection[WorkerKey] | None
    ) -> dict[WorkerKey, list[tuple[str, ...]]]:
        """The workers the first-block directory names that hold the first block, within
        `workers`. O(those x matched x parts), plus O(`workers`) when given. (Any sequence
        and collection, as the Redis store takes: compiled, a `list` would refuse a tuple.)"""
        if not hashes:
            return {}
        chosen = None if workers is None else set(workers)
        return {
            key: self._held_prefix(self._workers[key], hashes)
            for key in self._firsts.holders(hashes[0], self._holds)
            if chosen is None or key in chosen
        }

    async def match_tokens(
        self, tokens_hashes: Sequence[int], workers: Iterable[WorkerKey]
    ) -> dict[WorkerKey, list[tuple[str, ...]]]:
        out = {}
        for key in workers:
            w = self._workers.get(key)
            if w is None:
                continue
            path = w.index.tokens.walk(tokens_hashes)
            if path:
                out[key] = self._held_prefix(w, path)
        return out

    def _held_prefix(self, w: _Worker, hashes: Sequence[Hash]) -> list[tuple[str, ...]]:
        """Media holding each block of the run of `hashes` the worker holds from the first."""
        parts = [(part.medium, part.holders) for part in w.index.by_pid.values() if part.holders]
        out: list[tuple[str, ...]] = []
        for h in hashes:
            media = {medium for medium, part in parts if h in part}
            if not media:
                break
            out.append(tuple(sorted(media)))
        return out

    async def token_edges(self, worker: WorkerKey) -> dict[int, Edge]:
        w = self._workers.get(worker)
        return {} if w is None else dict(w.index.tokens.edge)

    def _holds(self, key: WorkerKey, h: Hash) -> bool:
        w = self._workers.get(key)
        return w is not None and w.index.holds(h)

    async def worker_models(self) -> Mapping[WorkerKey, str | None]:
        return {key: w.status.model for key, w in self._workers.items()}

    async def register_instance(self, instance: DynamoInstance) -> DynamoInstance | None:
        key = (instance.instance_id, instance.dp_rank)
        taken = self._instances.get(key)
        if taken is None:
            self._instances[key] = instance
        return taken

    async def instances(self) -> list[DynamoInstance]:
        return [self._instances[key] for key in sorted(self._instances)]

    async def unregister_instance(
        self, instance_id: int, dp_rank: int | None
    ) -> list[DynamoInstance]:
        gone = [
            key
            for key in sorted(self._instances)
            if key[0] == instance_id and (dp_rank is None or key[1] == dp_rank)
        ]
        return [self._instances.pop(key) for key in gone]

    async def close(self) -> None:
        return None


def _engine_time(w: _Worker) -> float:
    """The feed's time for a change no batch made: the worker's last engine time if known."""
    fence = w.index.fence
    return fence.last_ts if fence is not None else time.time()
