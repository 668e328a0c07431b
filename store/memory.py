"""The embedded index store: everything in this process's memory, no server needed.

Imports neither zmq, fastapi nor redis. One worker's entries double as its reverse map:
per (medium, group_idx), hash -> the sessions holding it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Iterable, Iterator, Sequence

from store.feed import FeedHub, FeedRecord, WorkerChange
from store.model import (
    DEFAULT_MEDIUM,
    AllCleared,
    ApplyOutcome,
    Batch,
    BlocksRemoved,
    BlocksStored,
    DynamoInstance,
    Expired,
    Fence,
    Frontier,
    Hash,
    Holders,
    IndexLostError,
    Page,
    PartKey,
    SessionOnWorker,
    SessionSummary,
    SessionView,
    WorkerKey,
    WorkerLosses,
    WorkerState,
    WorkerStatus,
    WorkerView,
    advance,
    decide,
    fell_behind,
    idle,
    note_store,
    release,
    reprefill_tokens,
    tally_losses,
)
from store.paging import SessionOrder, page_hashes, page_sessions

EXPIRE_CHUNK = 1_000
"""Residencies `expire_sessions` drops between two yields to the event loop."""


class _Session:
    """A session across workers; kept after its blocks are gone until it ages out."""

    __slots__ = ("last_seen", "session_id", "workers")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.workers: dict[WorkerKey, _Residency] = {}
        self.last_seen = 0.0


class _Residency:
    """One session on one worker: its hashes per part, when it last stored there, and what
    eviction took since (`SessionOnWorker`)."""

    __slots__ = (
        "added",
        "before",
        "block_size",
        "blocks",
        "frontier",
        "last_seen",
        "lost",
        "mark",
        "position",
        "removed",
        "session",
        "total",
    )

    def __init__(self, session: _Session) -> None:
        self.session = session
        self.blocks: dict[PartKey, set[Hash]] = {}
        self.total = 0
        """Entries in `blocks`, kept as they change: counting them is on every query path."""
        self.last_seen = 0.0
        self.lost = 0
        self.block_size: int | None = None
        self.frontier: Hash | None = None
        """The last block hash the session stored here; `position` its place (`Frontier`)."""
        self.position: int | None = None
        self.mark = 0
        """The batch number `added` and `removed` count for (the change feed's per-batch delta)."""
        self.added = 0
        self.removed = 0
        self.before = 0
        """`total` when this batch first touched the residency."""

    def touch(self, batch: int, touched: list[_Residency]) -> None:
        """Start counting this batch's delta, once per batch (before any change)."""
        if self.mark != batch:
            self.mark = batch
            self.added = self.removed = 0
            self.before = self.total
            touched.append(self)

    def count(self) -> int:
        return self.total

    def successor(self, cleared: int) -> _Residency:
        """The residency after the worker's cache emptied (`cleared` blocks lost with it):
        a new object, so the change feed ends this one's row as a clear ends a residency."""
        after = _Residency(self.session)
        after.last_seen = self.last_seen
        after.lost = self.lost + cleared
        after.block_size = self.block_size
        after.frontier = self.frontier
        after.position = self.position
        return after

    def view(self, key: WorkerKey) -> SessionOnWorker:
        return SessionOnWorker(
            pod=key.pod,
            dp_rank=key.dp_rank,
            blocks=self.total,
            by_medium=self.by_medium(),
            last_seen=self.last_seen,
            lost_blocks=self.lost,
            reprefill_tokens=reprefill_tokens(self.lost, self.block_size),
            frontier=None if self.frontier is None else Frontier(self.frontier, self.position),
        )

    def by_medium(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (medium, _), hashes in self.blocks.items():
            if hashes:
                out[medium] = out.get(medium, 0) + len(hashes)
        return out


class _Worker:
    __slots__ = (
        "active",
        "fence",
        "key",
        "last_event_at",
        "parts",
        "sessions",
        "status",
        "unconfirmed",
    )

    def __init__(self, key: WorkerKey) -> None:
        self.key = key
        self.parts: dict[PartKey, dict[Hash, Holders]] = {}
        self.sessions: dict[str, _Residency] = {}
        """In the order of their last store (a store moves its residency to the end): the
        idle ones come first, so expiry reads only what it drops."""
        self.active = 0
        """Sessions with at least one block here, kept per batch: list_workers is hot."""
        self.unconfirmed: dict[PartKey, set[Hash]] = {}
        """Entries held over an unrepaired gap and not stored again since."""
        self.fence: Fence | None = None
        self.status = WorkerStatus(since=time.time())
        self.last_event_at: float | None = None

    def entries(self) -> int:
        return sum(len(p) for p in self.parts.values())


class MemoryStore:
    """IndexStore in process memory; the embedded default."""

    def __init__(self, feed: FeedHub | None = None) -> None:
        self._workers: dict[WorkerKey, _Worker] = {}
        self._sessions: dict[str, _Session] = {}
        self._feed = feed if feed is not None else FeedHub()
        self._batch = 0
        """Number of the batch being applied; residencies count their delta against it."""
        self._touched: list[_Residency] = []
        """Residencies whose blocks the current batch changed, for the change feed."""
        self._instances: dict[tuple[int, int], DynamoInstance] = {}
        """Dynamo registrations by (instance_id, dp_rank)."""
        self._retired: list[tuple[float, str]] = []
        """Heap of (last_seen, id) of sessions left with no residency (their workers removed,
        or dropped while a removed worker's record is younger): forgotten once idle."""

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
            stored = None if known is None else known.fence
            if fell_behind(stored, expect):
                raise IndexLostError(worker, None if stored is None else stored.seq, expect)
        w = self._worker(worker)
        outcome = decide(w.fence, batch.seq, batch.ts)
        if outcome is ApplyOutcome.DUPLICATE or outcome is ApplyOutcome.PREVIOUS_ENGINE:
            return outcome
        self._batch += 1
        if outcome is ApplyOutcome.RESTARTED:
            self._clear(w, keep=True)
        ts = batch.ts
        for event in batch.events:
            if isinstance(event, BlocksStored):
                self._store(w, event, ts)
            elif isinstance(event, BlocksRemoved):
                self._remove(w, event)
            elif isinstance(event, AllCleared):
                self._clear(w, keep=True)
        w.fence = advance(w.fence, outcome, batch.seq, ts)
        w.last_event_at = time.time()
        self._finish(w, ts)
        return outcome

    def _finish(self, w: _Worker, ts: float, losses: bool = True) -> None:
        """Close a batch (or a worker operation): session counts, then the change feed
        (`losses`: its removals are losses, see `FeedRecord.losses`)."""
        if not self._touched:
            return
        for res in self._touched:
            if res.before == 0 and res.total > 0:
                w.active += 1
            elif res.before > 0 and res.total == 0:
                w.active -= 1
        self._publish_changes(w.key, ts, losses)

    def _publish_changes(self, worker: WorkerKey, ts: float, losses: bool) -> None:
        rows = tuple(
            sorted(
                (res.session.session_id, res.added, res.removed, res.total)
                for res in self._touched
                if res.added or res.removed
            )
        )
        self._touched = []
        if rows:
            self._feed.publish(FeedRecord(worker.pod, worker.dp_rank, ts, rows, losses=losses))

    def _store(self, w: _Worker, event: BlocksStored, ts: float) -> None:
        pk = (event.medium or DEFAULT_MEDIUM, event.group_idx or 0)
        part = w.parts.get(pk)
        if part is None:
            part = w.parts[pk] = {}
        hashes = event.block_hashes
        if w.unconfirmed:
            self._confirm(w, pk, hashes)
        if event.session_id is None:
            for h in hashes:
                if h not in part:
                    part[h] = None
            return
        sessions = w.sessions
        res = sessions.get(event.session_id) or self._new_residency(w, event.session_id)
        if ts > res.last_seen:
            res.last_seen = ts
            if ts > res.session.last_seen:
                res.session.last_seen = ts
            sid = res.session.session_id
            del sessions[sid]  # to the end: `sessions` stays in last-store order
            sessions[sid] = res
        note_store(res, event)
        held = res.blocks.get(pk)
        if held is None:
            held = res.blocks[pk] = set()
        before = len(held)
        held.update(hashes)
        if len(held) != before:
            if res.mark != self._batch:
                res.touch(self._batch, self._touched)
            res.added += len(held) - before
            res.total += len(held) - before
        sid = res.session.session_id
        get = part.get
        for h in hashes:
            holders = get(h)
            if holders is None:
                part[h] = sid
            elif isinstance(holders, str):
                if holders is not sid:
                    part[h] = {holders, sid}
            else:
                holders.add(sid)

    def _confirm(self, w: _Worker, pk: PartKey, hashes: list[Hash]) -> None:
        pending = w.unconfirmed.get(pk)
        if pending is not None:
            pending.difference_update(hashes)
            if not pending:
                del w.unconfirmed[pk]

    def _remove(self, w: _Worker, event: BlocksRemoved) -> None:
        pk = (event.medium or DEFAULT_MEDIUM, event.group_idx or 0)
        if w.unconfirmed:
            self._confirm(w, pk, event.block_hashes)
        self._remove_hashes(w, pk, event.block_hashes, 1)

    def _remove_hashes(self, w: _Worker, pk: PartKey, hashes: Iterable[Hash], lost: int) -> None:
        """Remove entries from the part and their sessions; `lost` (1, or 0 for the stale
        policy's drops) is what each removal adds to a session's lost blocks."""
        part = w.parts.get(pk)
        if not part:
            return
        sessions = w.sessions
        batch, touched = self._batch, self._touched
        pop = part.pop
        for h in hashes:
            holders = pop(h, None)
            if holders is None:
                continue
            if isinstance(holders, str):
                res = sessions[holders]
                res.blocks[pk].discard(h)
                if res.mark != batch:
                    res.touch(batch, touched)
                res.removed += 1
                res.total -= 1
                res.lost += lost
            else:
                for sid in holders:
                    res = sessions[sid]
                    res.blocks[pk].discard(h)
                    res.touch(batch, touched)
                    res.removed += 1
                    res.total -= 1
                    res.lost += lost

    def _clear(self, w: _Worker, *, keep: bool) -> None:
        """Empty the worker. With `keep`, each residency goes on (a successor) holding its
        blocks as lost: the engine's cache emptied, a next turn prefills them again;
        without (the worker is removed), residencies end."""
        w.parts.clear()
        w.unconfirmed.clear()
        batch = self._batch
        for sid, res in w.sessions.items():
            count = res.count()
            if count:
                res.touch(batch, self._touched)
                res.removed += count
            if not keep:
                session = self._sessions[sid]
                session.workers.pop(w.key, None)
                if not session.workers:
                    heapq.heappush(self._retired, (session.last_seen, sid))
            elif res.mark == batch:  # touched by this batch: its feed row ends here
                w.sessions[sid] = res.session.workers[w.key] = res.successor(count)
            res.blocks.clear()
            res.total = 0
        if not keep:
            w.sessions.clear()

    def _new_residency(self, w: _Worker, session_id: str) -> _Residency:
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = _Session(session_id)
        res = w.sessions[session.session_id] = _Residency(session)
        session.workers[w.key] = res
        return res

    def _worker(self, key: WorkerKey) -> _Worker:
        w = self._workers.get(key)
        if w is None:
            w = self._workers[key] = _Worker(key)
        return w

    async def fence(self, worker: WorkerKey) -> Fence | None:
        w = self._workers.get(worker)
        return w.fence if w else None

    async def set_status(self, worker: WorkerKey, status: WorkerStatus) -> None:
        w = self._worker(worker)
        changed = (w.status.state, w.status.detail) != (status.state, status.detail)
        w.status = status
        if changed:
            change = WorkerChange(
                worker.pod, worker.dp_rank, status.state, status.since, status.detail
            )
            record = FeedRecord(worker.pod, worker.dp_rank, status.since, state=change)
            self._feed.publish(record)

    async def change_feed(self) -> FeedHub:
        return self._feed

    async def mark_unconfirmed(self, worker: WorkerKey) -> int:
        w = self._workers.get(worker)
        if w is None:
            return 0
        w.unconfirmed = {pk: set(part) for pk, part in w.parts.items() if part}
        return sum(len(s) for s in w.unconfirmed.values())

    async def drop_unconfirmed(self, worker: WorkerKey) -> int:
        w = self._workers.get(worker)
        if w is None:
            return 0
        self._batch += 1
        dropped = 0
        for pk, pending in w.unconfirmed.items():
            dropped += len(pending)
            self._remove_hashes(w, pk, pending, 0)
        w.unconfirmed = {}
        self._finish(w, _engine_time(w), losses=False)
        return dropped

    async def clear_worker(self, worker: WorkerKey) -> None:
        w = self._workers.get(worker)
        if w is not None:
            self._batch += 1
            self._clear(w, keep=True)
            self._finish(w, _engine_time(w))

    async def remove_worker(self, worker: WorkerKey) -> None:
        w = self._workers.pop(worker, None)
        if w is not None:
            self._batch += 1
            self._clear(w, keep=False)
            self._finish(w, _engine_time(w), losses=False)

    async def expire_sessions(
        self, older_than: float, limit: int, *, written_only: bool = False
    ) -> Expired:
        """Per worker, its residencies from the least recently stored while `idle`, at most
        `limit`, then at most `limit` sessions of removed workers; a yield to the event loop
        every EXPIRE_CHUNK drops. O(dropped residencies' blocks + limit), nothing else read."""
        residencies = sessions = 0
        more = False
        for w in list(self._workers.values()):
            due = list(
                itertools.takewhile(
                    lambda r: idle(r.last_seen, older_than),
                    itertools.islice(w.sessions.values(), limit + 1),
                )
            )
            more = more or len(due) > limit
            del due[limit:]
            for start in range(0, len(due), EXPIRE_CHUNK):
                if self._workers.get(w.key) is not w:
                    break  # removed during a pause
                dropped, forgotten = self._drop(w, due[start : start + EXPIRE_CHUNK], older_than)
                residencies += dropped
                sessions += forgotten
                await asyncio.sleep(0)
        retired = self._retired
        looked = 0
        while retired and retired[0][0] < older_than and looked < limit:
            _, sid = heapq.heappop(retired)
            looked += 1
            session = self._sessions.get(sid)
            if session is not None and not session.workers and idle(session.last_seen, older_than):
                del self._sessions[sid]
                sessions += 1
        more = more or bool(retired and retired[0][0] < older_than)
        return Expired(residencies, sessions, more)

    def _drop(self, w: _Worker, due: list[_Residency], older_than: float) -> tuple[int, int]:
        """Drop residencies of `w` still idle (one stored during a pause stays): their
        entries stay on the worker (`release`); the change feed gets their removed blocks as
        for the stale policy's drops. Returns (residencies dropped, sessions forgotten)."""
        self._batch += 1
        batch, touched = self._batch, self._touched
        dropped = forgotten = 0
        for res in due:
            session = res.session
            sid = session.session_id
            if w.sessions.get(sid) is not res or not idle(res.last_seen, older_than):
                continue
            if res.total:
                res.touch(batch, touched)
                res.removed += res.total
                for pk, held in res.blocks.items():
                    part = w.parts.get(pk)
                    if part is not None:
                        for h in held:
                            if h in part:
                                part[h] = release(part[h], sid)
                res.blocks.clear()
                res.total = 0
            del w.sessions[sid]
            del session.workers[w.key]
            dropped += 1
            if not session.workers:
                if idle(session.last_seen, older_than):
                    del self._sessions[sid]
                    forgotten += 1
                else:  # a removed worker saw it later: it stays until that ages out
                    heapq.heappush(self._retired, (session.last_seen, sid))
        self._finish(w, _engine_time(w), losses=False)
        return dropped, forgotten

    # -- read side ----------------------------------------------------------------------

    async def get_session(self, session_id: str) -> SessionView | None:
        session = self._sessions.get(session_id)
        if session is None:
            return None
        workers = [res.view(key) for key, res in session.workers.items() if res.total or res.lost]
        workers.sort(key=lambda s: (-s.blocks, s.pod, s.dp_rank))
        return SessionView(
            session_id=session_id,
            total_blocks=sum(s.blocks for s in workers),
            last_seen=session.last_seen,
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
            if pod is None or key.pod == pod:
                for (m, _), held in res.blocks.items():
                    if medium is None or m == medium:
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
                res.count() for key, res in session.workers.items() if pod is None or key.pod == pod
            ]
            blocks = sum(counts)
            if held_only and not blocks:
                continue
            yield SessionSummary(
                session_id=sid,
                blocks=blocks,
                workers=sum(1 for c in counts if c),
                last_seen=session.last_seen,
            )

    async def list_workers(self) -> list[WorkerView]:
        return [
            WorkerView(
                pod=w.key.pod,
                dp_rank=w.key.dp_rank,
                blocks=w.entries(),
                sessions=w.active,
                last_seq=w.fence.seq if w.fence else None,
                last_event_at=w.last_event_at,
                status=w.status,
                unconfirmed=sum(len(s) for s in w.unconfirmed.values()),
            )
            for _, w in sorted(self._workers.items())
        ]

    async def worker_losses(self) -> dict[WorkerKey, WorkerLosses]:
        """Summed from every residency: O(residencies), a worker at a time with a yield to
        the event loop after each (all at once, 100,000 residencies stall requests ~50 ms)."""
        out = {}
        for key, w in list(self._workers.items()):
            out[key] = tally_losses((r.lost, r.block_size) for r in list(w.sessions.values()))
            await asyncio.sleep(0)
        return out

    async def worker_states(self) -> dict[WorkerKey, WorkerState]:
        """Exact: read from the workers as they are. O(workers)."""
        return {key: w.status.state for key, w in self._workers.items()}

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
            for (m, _), part in w.parts.items():
                if medium is None or m == medium:
                    hashes.update(part)
        return page_hashes(hashes, limit, cursor)

    async def match_prefix(
        self, hashes: list[Hash], workers: list[WorkerKey] | None
    ) -> dict[WorkerKey, list[tuple[str, ...]]]:
        chosen = (
            self._workers.values()
            if workers is None
            else [self._workers[k] for k in workers if k in self._workers]
        )
        return {w.key: _held_prefix(w, hashes) for w in chosen}

    async def worker_models(self) -> dict[WorkerKey, str | None]:
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
    return w.fence.last_ts if w.fence is not None else time.time()


def _held_prefix(w: _Worker, hashes: list[Hash]) -> list[tuple[str, ...]]:
    """Media holding each block of the run of `hashes` the worker holds from the first."""
    if not hashes or not any(hashes[0] in part for part in w.parts.values()):
        return []  # most workers of a fleet, for any one prompt: answered in one look
    parts = [(medium, part) for (medium, _), part in w.parts.items() if part]
    out: list[tuple[str, ...]] = []
    for h in hashes:
        media = {medium for medium, part in parts if h in part}
        if not media:
            break
        out.append(tuple(sorted(media)))
    return out
