"""The writer's copy of one worker's index: the reverse map that turns a batch into plain writes.

Imports neither zmq, fastapi nor redis: store.redis loads it and sends the Plans it returns.

Why a copy: DESIGN.md measured that per-block logic inside Redis is what limits ingest. Every
writer of a worker's stream applies the same batches in the same order, so the writer can
keep the reverse map (entry -> sessions) here, work out each batch's delta in Python and send
Redis variadic SADD/SREM per touched key, guarded by the fence and this copy's version.
Methods mutate the copy while they build the Plan; the caller discards the copy whenever
Redis does not confirm the write, and reloads it when needed.
"""

from __future__ import annotations

import itertools
import time
import zlib
from collections.abc import Iterable
from typing import Final

import msgspec

from store.feed import FeedRecord, ResidencyRow
from store.model import (
    DEFAULT_MEDIUM,
    AllCleared,
    ApplyOutcome,
    Batch,
    BlocksRemoved,
    BlocksStored,
    Fence,
    Hash,
    Holders,
    PartKey,
    advance,
    idle,
    note_store,
    release,
)
from store.redis_layout import (
    NO_PROGRESS,
    Progress,
    WorkerKeys,
    bucket,
    encode_part,
    encode_progress,
    encode_residency,
    members,
)
from store.redis_plan import (
    HDEL,
    HSET,
    HSETNX,
    INDEX_ADD,
    INDEX_DEL,
    LPUSH,
    LTRIM,
    SADD,
    SREM,
    SREM1,
    STORE_INDEXED,
    XADD,
    ZADD,
    ZREM,
    Arg,
    Plan,
)

_ABSENT: Final[set[str]] = set()
"""Default of `holders.get`: an object of the holder type that is never stored."""

VLOG_LENGTH = 16
"""Versions kept in the worker's log: how far (in batches) a second writer of the same stream
may lag and still follow the first without reloading its copy."""


FEED_LENGTH = 1000
"""Records kept in a worker's feed stream (`XADD MAXLEN ~`): what an API replica's pump may
lag behind (it reads every ~50 ms); resuming a watch uses the replica's own history."""

_ENCODER = msgspec.msgpack.Encoder()


def batch_id(batch: Batch) -> str:
    """What names a batch in the version log: seq, engine time and a CRC of its events.

    (seq, ts) alone names a batch of one stream; the CRC (~2 µs a batch) makes sure that a
    writer follows another's version only for the very events it applied itself.
    """
    return f"{batch.seq}:{batch.ts!r}:{zlib.crc32(_ENCODER.encode(batch.events)):08x}"


class Part:
    """One (medium, group) of the worker: entry -> holders, and entries still unconfirmed."""

    __slots__ = ("ebase", "ekeys", "group", "holders", "medium", "okey", "pending", "pid", "ukey")

    def __init__(self, keys: WorkerKeys, pid: int, medium: str, group: int) -> None:
        self.pid = pid
        self.medium = medium
        self.group = group
        self.holders: dict[Hash, Holders] = {}
        self.pending: set[Hash] = set()
        self.okey = keys.orphans(pid)
        self.ukey = keys.unconfirmed(pid)
        self.ekeys = keys.entries(pid)
        """The entry index's bucket keys, by `bucket(h)`."""
        self.ebase = keys.entry_base(pid)


class Residency:
    """One session on this worker: blocks per part, when it last stored here, and what
    eviction took since (`store.model.SessionOnWorker`)."""

    __slots__ = (
        "block_size",
        "counts",
        "frontier",
        "keys",
        "lost",
        "position",
        "session_id",
        "t",
        "total",
        "tr",
    )

    def __init__(self, session_id: str, t: float = 0.0, progress: Progress = NO_PROGRESS) -> None:
        self.session_id = session_id
        self.t = t
        self.tr = repr(t)
        """`repr(t)`, as the residency value starts: kept so a removal does not format it."""
        self.counts: dict[int, int] = {}
        self.total = 0
        self.keys: dict[int, str] = {}
        """Set key per part id, built once (key strings cost more than the set operations)."""
        self.lost = progress.lost
        self.block_size = progress.block_size
        self.frontier = progress.frontier
        self.position = progress.position

    def value(self) -> str:
        """The residency hash's value (`redis_layout.encode_residency`)."""
        progress = encode_progress(self.lost, self.block_size, self.frontier, self.position)
        if self.total == self.counts.get(0):  # one part, the first: the common case
            return f"{self.tr}{progress} 0:{self.total}"
        return encode_residency(self.t, self.counts, progress)


class _Delta:
    """What a write changes, keyed so the last change of a member wins (store then remove)."""

    __slots__ = ("deletes", "new_parts", "pending", "sets", "touched")

    def __init__(self) -> None:
        self.sets: dict[str, dict[Hash, bool]] = {}
        """Session and orphan sets: member -> present at the end."""
        self.pending: dict[str, list[Hash]] = {}
        self.touched: dict[str, Residency] = {}
        self.deletes: list[str] = []
        self.new_parts: list[Part] = []

    def set(self, key: str) -> dict[Hash, bool]:
        acc = self.sets.get(key)
        if acc is None:
            acc = self.sets[key] = {}
        return acc


class Mirror:
    """One worker's entries, holders, residencies, fence and version, as Redis has them.

    `ver` is the stored version this copy reflects: every write changes it, and apply.lua
    writes only if it still matches, so a stale copy can never write a wrong delta.
    """

    def __init__(
        self,
        keys: WorkerKeys,
        ver: str,
        fence: Fence | None,
        has_status: bool,
        indexed: bool = False,
    ) -> None:
        self.keys = keys
        self.ver = ver
        self.fence = fence
        self.has_status = has_status
        self.parts: dict[PartKey, Part] = {}
        self.by_pid: dict[int, Part] = {}
        self.res: dict[str, Residency] = {}
        """In the order of their last store (a store moves its residency to the end; a load
        sorts by time): the idle ones come first, so expiry reads only what it drops."""
        self.nonempty = 0
        """Residencies holding at least one block: the worker's `sessions` count."""
        self.writes = 0
        """Writes through this copy: every VLOG_LENGTH-th one trims the version log."""
        self.registered = False
        """Whether the worker is in the registry (its meta existed at load, or we added it)."""
        self.indexed = indexed
        """Whether Redis has the worker's entry index (meta `idx`); if not (a worker written
        before the index existed, or a new one), the next write builds it whole."""
        self.feed_length = FEED_LENGTH
        self._delta: dict[str, list[int]] = {}
        """Per session, [added, removed] in the batch being planned (the feed's rows)."""
        self._closed: list[ResidencyRow] = []
        """Rows of residencies a clear ended in the batch being planned."""
        self._touched: dict[str, Residency] = {}
        self._seen: dict[str, float] = {}
        """Residencies and last-seen scores (-ts) the run so far changed (see `apply`)."""
        self._log: list[str] = []
        """Version log entries of the run so far, oldest first."""

    # -- loading (store.redis reads the keys, this rebuilds the maps) -----------------------

    def add_part(self, pid: int, medium: str, group: int) -> Part:
        part = self.parts[(medium, group)] = self.by_pid[pid] = Part(self.keys, pid, medium, group)
        return part

    def add_residency(
        self, session_id: str, t: float, progress: Progress = NO_PROGRESS
    ) -> Residency:
        res = self.res[session_id] = Residency(session_id, t, progress)
        return res

    def hold(self, part: Part, res: Residency, hashes: Iterable[Hash]) -> None:
        """Load one session set: `res` holds `hashes` in `part`."""
        holders = part.holders
        sid = res.session_id
        added = 0
        for h in hashes:
            cur = holders.get(h, _ABSENT)
            if cur is _ABSENT or cur is None:
                holders[h] = sid
            elif isinstance(cur, str):
                holders[h] = {cur, sid}
            else:
                cur.add(sid)
            added += 1
        if added:
            if not res.total:
                self.nonempty += 1
            res.counts[part.pid] = res.counts.get(part.pid, 0) + added
            res.total += added

    def add_orphans(self, part: Part, hashes: Iterable[Hash]) -> None:
        for h in hashes:
            part.holders.setdefault(h, None)

    # -- writes: each mutates the copy and returns the Plan that makes Redis agree ---------

    def apply(
        self, batch: Batch, outcome: ApplyOutcome, token: str, now: float, *, last: bool = True
    ) -> Plan:
        """The batch's delta for an APPLIED or RESTARTED outcome.

        The ops follow the events in order (apply.lua replays them in order), so nothing is
        merged across events: each event's writes go straight into the Plan (entry-index
        changes as marks that apply.lua writes per bucket at the end of the call). What holds
        one value per session or per worker is written once, with its final value: the
        touched residencies, their last-seen scores, the counts, fence and version (with the
        version log's entries in one LPUSH). That is once per batch, or, for a run of batches
        landing in one call (`last` False for all but its last), once per run: their keys are
        not among the ones a clear deletes, so writing them after the run's other ops leaves
        what writing each batch's in turn would.
        """
        plan = Plan(self.keys)
        touched = self._touched
        self._delta = {}
        self._closed = []
        if outcome is ApplyOutcome.RESTARTED:
            self._clear_in(plan, touched)
        ts = batch.ts
        tr = repr(ts)
        stored: dict[str, None] = {}
        parts = self.parts
        for event in batch.events:
            if isinstance(event, BlocksStored):
                self._store_in(plan, event, ts, tr, stored, touched)
            elif isinstance(event, BlocksRemoved):
                part = parts.get((event.medium or DEFAULT_MEDIUM, event.group_idx or 0))
                if part is not None:
                    if part.pending:
                        self._confirm_in(plan, part, event.block_hashes)
                    self._remove_in(plan, part, event.block_hashes, touched)
            elif isinstance(event, AllCleared):
                self._clear_in(plan, touched)
        self.fence = fence = advance(self.fence, outcome, batch.seq, ts)
        if self._delta or self._closed:
            self._feed_in(plan, ts, losses=True)
        if stored:
            # Global last_seen is the max over workers; -t so that ascending order is the
            # listing order, and LT keeps the max. A new session starts at 0, as in memory.
            score = -max(ts, 0.0)
            seen = self._seen
            for sid in stored:
                old = seen.get(sid)
                if old is None or score < old:
                    seen[sid] = score
        meta: list[Arg] = [
            "seq", fence.seq, "epoch", fence.epoch_ts, "last_ts", fence.last_ts, "event_at", now
        ]  # fmt: skip
        self._finish(plan, token, batch_id(batch), meta, last=last)
        if last:
            self._write_run(plan, now)
        return plan

    def _write_run(self, plan: Plan, now: float) -> None:
        """The residencies, last-seen scores and status start that the batches since the last
        call touched, with their final values (see `apply`)."""
        if self._touched:
            args: list[Arg] = []
            for sid, res in self._touched.items():
                args += (sid, res.value())
            plan.call(HSET, self.keys.res, args)
            self._touched = {}
        if self._seen:
            zargs: list[Arg] = []
            for sid, score in self._seen.items():
                zargs += (score, sid)
            plan.call(ZADD, self.keys.seen, zargs, lead=("LT",))
            self._seen = {}
        if not self.has_status:
            plan.call(HSETNX, self.keys.meta, ["since", now])
            self.has_status = True

    def _store_in(
        self,
        plan: Plan,
        event: BlocksStored,
        ts: float,
        tr: str,
        stored: dict[str, None],
        touched: dict[str, Residency],
    ) -> None:
        # The hot path of ingest: lookups are inlined rather than factored into helpers.
        part = self.parts.get((event.medium or DEFAULT_MEDIUM, event.group_idx or 0))
        if part is None:
            part = self.add_part(
                len(self.by_pid), event.medium or DEFAULT_MEDIUM, event.group_idx or 0
            )
            plan.call(HSET, self.keys.parts, [part.pid, encode_part(part.medium, part.group)])
        hashes = event.block_hashes
        if part.pending:
            self._confirm_in(plan, part, hashes)
        holders = part.holders
        if event.session_id is None:
            new = []
            for h in hashes:
                if h not in holders:
                    holders[h] = None
                    new.append(h)
            if new:
                plan.index(STORE_INDEXED, part.ebase, members(new), part.okey)
            return
        res = self.res.get(event.session_id)
        if res is None:
            res = self.add_residency(event.session_id, 0.0)
            touched[res.session_id] = res
        sid = res.session_id
        stored[sid] = None
        touched[sid] = res  # its lost blocks and frontier change with every store
        if ts > res.t:
            res.t = ts
            res.tr = tr
            residencies = self.res
            del residencies[sid]  # to the end: `res` stays in last-store order
            residencies[sid] = res
        note_store(res, event)
        added: list[Hash] = []
        fresh: list[Hash] = []
        adopted: list[Hash] | None = None
        for h in hashes:
            cur = holders.get(h, _ABSENT)
            if cur is _ABSENT:
                holders[h] = sid
                fresh.append(h)
            elif cur is None:
                holders[h] = sid
                if adopted is None:
                    adopted = [h]
                else:
                    adopted.append(h)
            elif cur is sid:
                continue
            elif isinstance(cur, str):
                holders[h] = {cur, sid}
            elif sid in cur:
                continue
            else:
                cur.add(sid)
            added.append(h)
        if adopted:
            plan.call(SREM, part.okey, members(adopted))
        if added:
            pid = part.pid
            key = res.keys.get(pid) or self._key(res, pid)
            if len(fresh) == len(added):  # all new to the worker: the common case
                plan.index(STORE_INDEXED, part.ebase, members(added), key)
            else:
                plan.call(SADD, key, members(added))
                if fresh:
                    plan.index(INDEX_ADD, part.ebase, members(fresh))
            n = len(added)
            if not res.total:
                self.nonempty += 1
            res.total += n
            res.counts[pid] = res.counts.get(pid, 0) + n
            delta = self._delta.get(sid)
            if delta is None:
                self._delta[sid] = [n, 0]
            else:
                delta[0] += n

    def _confirm_in(self, plan: Plan, part: Part, hashes: list[Hash]) -> None:
        gone = part.pending.intersection(hashes)
        if gone:
            part.pending -= gone
            plan.call(SREM, part.ukey, members(gone))

    def _remove_in(
        self, plan: Plan, part: Part, hashes: list[Hash], touched: dict[str, Residency]
    ) -> None:
        """Removals, grouped per set; a set losing one member (the common case: evicted
        blocks of many sessions) goes in one SREM1 op with the others (two args each)."""
        pop = part.holders.pop
        pid = part.pid
        residencies = self.res
        groups: dict[str, list[Hash]] = {}
        owner: dict[str, Residency] = {}
        orphans: list[Hash] = []
        gone: list[Hash] = []
        for h in hashes:
            cur = pop(h, _ABSENT)
            if cur is _ABSENT:
                continue
            gone.append(h)
            if cur is None:
                orphans.append(h)
                continue
            for sid in (cur,) if isinstance(cur, str) else cur:
                res = residencies[sid]
                key = res.keys.get(pid) or self._key(res, pid)
                group = groups.get(key)
                if group is None:
                    groups[key] = [h]
                    owner[key] = res
                else:
                    group.append(h)
        if orphans:
            plan.call(SREM, part.okey, members(orphans))
        if gone:
            plan.index(INDEX_DEL, part.ebase, members(gone))
        if not groups:
            return
        single_keys: list[str] = []
        singles: list[Hash] = []
        deltas = self._delta
        for key, group in groups.items():
            res = owner[key]
            n = len(group)
            if n == 1:
                single_keys.append(key)
                singles.append(group[0])
            else:
                plan.call(SREM, key, members(group))
            left = res.counts[pid] - n
            if left:
                res.counts[pid] = left
            else:
                del res.counts[pid]
            res.total -= n
            res.lost += n
            if not res.total:
                self.nonempty -= 1
            touched[res.session_id] = res
            delta = deltas.get(res.session_id)
            if delta is None:
                deltas[res.session_id] = [0, n]
            else:
                delta[1] += n
        if singles:
            plan.singles(SREM1, single_keys, members(singles))

    def _clear_in(self, plan: Plan, touched: dict[str, Residency]) -> None:
        # The feed's rows as the memory store has them: every residency of the batch so far,
        # or holding blocks, ends here with 0 blocks; one stored again later is a new row.
        closed = self._closed
        delta = self._delta
        for sid, res in self.res.items():
            counted = delta.get(sid)
            if counted is not None:
                closed.append((sid, counted[0], counted[1] + res.total, 0))
            elif res.total:
                closed.append((sid, 0, res.total, 0))
        self._delta = {}
        d = _Delta()
        self._clear(d)
        plan.delete(d.deletes)
        touched.update(d.touched)

    def mark_unconfirmed(self, token: str) -> tuple[Plan, int]:
        """Copy every part's entries to its unconfirmed set (SUNIONSTORE, server side)."""
        plan = Plan(self.keys)
        for part in self.by_pid.values():
            part.pending = set(part.holders)
            if part.pending:
                sources = [
                    self._key(r, part.pid) for r in self.res.values() if part.pid in r.counts
                ]
                plan.union_store(part.ukey, [*sources, part.okey])
            else:
                plan.delete([part.ukey])
        self._finish(plan, token, "", [])
        return plan, self._unconfirmed()

    def drop_unconfirmed(self, token: str) -> tuple[Plan, int]:
        """Remove the still-unconfirmed entries from the worker and their sessions (with the
        change-feed record of the residencies that lost blocks, as for a batch)."""
        d = _Delta()
        self._delta = {}
        dropped = 0
        for part in self.by_pid.values():
            if part.pending:
                gone, part.pending = part.pending, set()
                dropped += len(gone)
                self._remove_hashes(d, part, gone)
                d.deletes.append(part.ukey)
        return self._plan(d, token, "", [], losses=False), dropped

    def clear(self, token: str) -> Plan:
        """Drop every entry; fence, parts and the seen sessions stay, and every residency
        holds its blocks as lost (`_clear`). Every residency holding blocks ends in the
        change feed with 0 blocks."""
        d = _Delta()
        self._delta = {}
        self._closed = [(sid, 0, r.total, 0) for sid, r in self.res.items() if r.total]
        self._clear(d)
        return self._plan(d, token, "", [], losses=True)

    def remove(self) -> Plan:
        """Delete every key of the worker."""
        d = _Delta()
        self._clear(d)
        self.res.clear()
        keys = self.keys
        plan = Plan(keys)
        plan.delete([*d.deletes, keys.meta, keys.vlog, keys.parts, keys.seen, keys.res, keys.feed])
        return plan

    def idle(self, older_than: float, limit: int) -> list[Residency]:
        """Up to `limit + 1` residencies, least recently stored first, while `idle`."""
        return list(
            itertools.takewhile(
                lambda r: idle(r.t, older_than), itertools.islice(self.res.values(), limit + 1)
            )
        )

    def expire(self, due: list[tuple[Residency, dict[int, list[Hash]]]], token: str) -> Plan:
        """Drop the residencies `due`, each with its entries per part as Redis holds them
        (the session sets, read by the caller): an entry no other session holds stays on the
        worker as one no session holds (the part's orphans); the session sets, the residency
        and its seen score go. One feed row per residency that held blocks, as for the stale
        policy's drops (not losses)."""
        plan = Plan(self.keys)
        self._delta = {}
        self._closed = []
        deletes: list[str] = []
        for res, held in due:
            sid = res.session_id
            for pid, hashes in held.items():
                part = self.by_pid[pid]
                holders = part.holders
                orphans = []
                for h in hashes:
                    cur = holders.get(h, _ABSENT)
                    if cur is not _ABSENT:
                        holders[h] = after = release(cur, sid)
                        if after is None:
                            orphans.append(h)
                if orphans:
                    plan.call(SADD, part.okey, members(orphans))
                deletes.append(self._key(res, pid))
            if res.total:
                self.nonempty -= 1
                self._closed.append((sid, 0, res.total, 0))
            del self.res[sid]
        if deletes:
            plan.delete(deletes)
        sids = [res.session_id for res, _ in due]
        plan.call(HDEL, self.keys.res, sids)
        plan.call(ZREM, self.keys.seen, sids)
        if self._closed:
            t = self.fence.last_ts if self.fence is not None else time.time()
            self._feed_in(plan, t, losses=False)
        self._finish(plan, token, "", [])
        return plan

    # -- the delta ---------------------------------------------------------------------

    def _key(self, res: Residency, pid: int) -> str:
        key = res.keys.get(pid)
        if key is None:
            key = res.keys[pid] = self.keys.session(pid, res.session_id)
        return key

    def _remove_hashes(self, d: _Delta, part: Part, hashes: Iterable[Hash]) -> None:
        pop = part.holders.pop
        pid = part.pid
        sets = d.sets
        for h in hashes:
            cur = pop(h, _ABSENT)
            if cur is _ABSENT:
                continue
            d.set(part.ekeys[bucket(h)])[h] = False
            if cur is None:
                d.set(part.okey)[h] = False
                continue
            for sid in (cur,) if isinstance(cur, str) else cur:
                # Inlined: this loop is the cost of evictions, one pass per (block, holder).
                res = self.res[sid]
                key = res.keys.get(pid) or self._key(res, pid)
                acc = sets.get(key)
                if acc is None:
                    acc = sets[key] = {}
                acc[h] = False
                left = res.counts[pid] - 1
                if left:
                    res.counts[pid] = left
                else:
                    del res.counts[pid]
                res.total -= 1
                if not res.total:
                    self.nonempty -= 1
                d.touched[sid] = res
                delta = self._delta.get(sid)
                if delta is None:
                    self._delta[sid] = [0, 1]
                else:
                    delta[1] += 1

    def _feed_in(self, plan: Plan, ts: float, *, losses: bool) -> None:
        """The batch's change-feed record, as store.memory publishes it: one row per session
        whose blocks changed, (session, added, removed, blocks now), sorted (`losses`: see
        `FeedRecord.losses`)."""
        res = self.res
        rows = sorted(
            [
                *self._closed,
                *((sid, d[0], d[1], res[sid].total) for sid, d in self._delta.items()),
            ]
        )
        self._delta = {}
        self._closed = []
        if rows:
            worker = self.keys.worker
            record = FeedRecord(worker.pod, worker.dp_rank, ts, tuple(rows), losses=losses)
            plan.call(
                XADD,
                self.keys.feed,
                ["MAXLEN", "~", self.feed_length, "*", "r", _ENCODER.encode(record)],
            )

    def _clear(self, d: _Delta) -> None:
        """Every entry gone; the residencies stay, their blocks counted as lost (the engine's
        cache emptied: a next turn prefills them again), and those that held blocks go to
        `d.touched` to be written again. Those without blocks are unchanged."""
        # Keys touched earlier in this write may exist in Redis with members this copy no
        # longer lists (a removal before the clear), so they are deleted too.
        d.deletes.extend(d.sets)
        for sid, res in self.res.items():
            if res.counts:
                d.deletes.extend(self._key(res, pid) for pid in res.counts)
                res.counts.clear()
                res.lost += res.total
                res.total = 0
                d.touched[sid] = res
        for part in self.by_pid.values():
            d.deletes += (part.okey, part.ukey)
            d.deletes += part.ekeys
            part.holders.clear()
            part.pending.clear()
        self.nonempty = 0
        d.sets.clear()
        d.pending.clear()

    def _build_index(self, plan: Plan) -> None:
        """The whole entry index, from the holders: once per worker written before it existed
        (O(worker entries)), and on a new worker's first write (SADDs of what it just added)."""
        for part in self.by_pid.values():
            buckets: dict[int, list[Hash]] = {}
            for h in part.holders:
                b = bucket(h)
                group = buckets.get(b)
                if group is None:
                    buckets[b] = [h]
                else:
                    group.append(h)
            for b, group in buckets.items():
                plan.call(SADD, part.ekeys[b], members(group))
        self.indexed = True

    def _unconfirmed(self) -> int:
        return sum(len(p.pending) for p in self.by_pid.values())

    def _plan(self, d: _Delta, token: str, name: str, meta: list[Arg], *, losses: bool) -> Plan:
        keys = self.keys
        plan = Plan(keys)
        if d.deletes:
            plan.delete(d.deletes)
        for part in d.new_parts:
            plan.call(HSET, keys.parts, [part.pid, encode_part(part.medium, part.group)])
        call = plan.call
        for key, acc in d.sets.items():
            if not acc:
                continue
            if False not in acc.values():
                call(SADD, key, members(acc))
            elif True not in acc.values():
                call(SREM, key, members(acc))
            else:
                call(SADD, key, members([h for h, present in acc.items() if present]))
                call(SREM, key, members([h for h, present in acc.items() if not present]))
        for key, gone in d.pending.items():
            plan.call(SREM, key, members(gone))
        if d.touched:
            args: list[Arg] = []
            for sid, res in d.touched.items():
                args += (sid, res.value())
            call(HSET, keys.res, args)
        if self._delta or self._closed:
            # A change no batch made: the worker's last engine time, as store.memory has it.
            t = self.fence.last_ts if self.fence is not None else time.time()
            self._feed_in(plan, t, losses=losses)
        self._finish(plan, token, name, meta)
        return plan

    def _finish(
        self, plan: Plan, token: str, name: str, meta: list[Arg], *, last: bool = True
    ) -> None:
        """Counts, version and its log entry (`name`: the batch, "" for other writes); with
        `last` False only the log entry, kept for the run's last call (see `apply`)."""
        self._log.append(f"{self.ver} {token} {name}")
        self.writes += 1
        if not last:
            return
        if not self.indexed:
            self._build_index(plan)
            meta = [*meta, "idx", 1]
        blocks = sum(len(p.holders) for p in self.by_pid.values())
        plan.call(
            HSET,
            self.keys.meta,
            [
                "ver",
                token,
                "blocks",
                blocks,
                "sessions",
                self.nonempty,
                "unconfirmed",
                self._unconfirmed(),
                *meta,
            ],
        )
        log, self._log = self._log, []
        plan.call(LPUSH, self.keys.vlog, log)  # the newest ends first
        if self.writes // VLOG_LENGTH != (self.writes - len(log)) // VLOG_LENGTH:
            # Trimmed once per VLOG_LENGTH writes, not each: the list stays under twice that
            # per writer, for one command in VLOG_LENGTH.
            plan.call(LTRIM, self.keys.vlog, [0, VLOG_LENGTH - 1])
