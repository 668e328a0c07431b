"""The Redis writer's copy of one worker's index: the index core plus the Redis plan of each write.

Imports neither zmq, fastapi nor redis: store.redis loads it and sends the Plans it returns.
The index itself (reverse map, residencies, losses, frontier, expiry order, feed rows) is
store/core.py's `WorkerIndex`, the memory store's too; this module turns what each of its
writes changed into the plain writes that make Redis agree.

Why a copy: DESIGN.md measured that per-block logic inside Redis is what limits ingest. Every
writer of a worker's stream applies the same batches in the same order, so the writer can
keep the reverse map (entry -> sessions) here, work out each batch's delta in Python and send
Redis variadic SADD/SREM per touched key, guarded by the fence and this copy's version.
Methods mutate the copy while they build the Plan; the caller discards the copy whenever
Redis does not confirm the write, and reloads it when needed.
"""

from __future__ import annotations

import time
import zlib
from functools import partial
from typing import Final, cast

import msgspec

from kvsi.store.core import StoredFields, WorkerIndex, merged_removals, stored_fields
from kvsi.store.feed import FeedRecord
from kvsi.store.model import (
    REMOVED,
    STORED,
    ApplyOutcome,
    Batch,
    EntriesRemoved,
    EntriesStored,
    Fence,
    Hash,
    advance,
)
from kvsi.store.redis.layout import (
    NO_PROGRESS,
    MirrorResidency,
    Progress,
    RedisPart,
    WorkerKeys,
    bucket,
    edge_field,
    encode_part,
    loss_fields,
    member,
    member_texts,
    members,
)
from kvsi.store.redis.plan import (
    HDEL,
    HSET,
    HSETNX,
    LPUSH,
    LTRIM,
    SADD,
    SREM,
    XADD,
    ZADD,
    ZREM,
    Arg,
    Plan,
)
from kvsi.store.tokens import Edge

VLOG_LENGTH: Final = 16
"""Versions kept in the worker's log: how far (in batches) a second writer of the same stream
may lag and still follow the first without reloading its copy."""


FEED_LENGTH: Final = 1000
"""Records kept in a worker's feed stream (`XADD MAXLEN ~`): what an API replica's pump may
lag behind (it reads in short rounds); resuming a watch uses the replica's own history."""

_ENCODER: Final = msgspec.msgpack.Encoder()


def batch_id(batch: Batch) -> str:
    """What names a batch in the version log: seq, engine time and a CRC of its events.

    (seq, ts) alone names a batch of one stream; the CRC (cheap beside the batch) makes sure that a
    writer follows another's version only for the very events it applied itself.
    """
    return f"{batch.seq}:{batch.ts!r}:{zlib.crc32(_ENCODER.encode(batch.events)):08x}"


class Mirror:
    """One worker's index (`WorkerIndex`) with its version, as Redis has them.

    `ver` is the stored version this copy reflects: every write changes it, and apply.lua
    writes only if it still matches, so a stale copy can never write a wrong delta.
    """

    __slots__ = (
        "_log",
        "_seen",
        "_touched",
        "feed_length",
        "has_status",
        "index",
        "indexed",
        "keys",
        "registered",
        "ver",
        "writes",
    )

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
        self.index: WorkerIndex[RedisPart, MirrorResidency] = WorkerIndex(
            partial(RedisPart, keys), MirrorResidency
        )
        self.index.fence = fence
        self.has_status = has_status
        self.writes = 0
        """Writes through this copy: every VLOG_LENGTH-th one trims the version log."""
        self.registered = False
        """Whether the worker is in the registry (its meta existed at load, or we added it)."""
        self.indexed = indexed
        """Whether Redis has the worker's entry index (meta `idx`); if not (a worker written
        before the index existed, or a new one), the next write builds it whole."""
        self.feed_length = FEED_LENGTH
        self._touched: dict[str, MirrorResidency] = {}
        self._seen: dict[str, float] = {}
        """Residencies and last-seen scores (-ts) the run so far changed (see `apply`)."""
        self._log: list[str] = []
        """Version log entries of the run so far, oldest first."""

    @property
    def fence(self) -> Fence | None:
        return self.index.fence

    def add_residency(
        self, session_id: str, last_store: float, progress: Progress = NO_PROGRESS
    ) -> MirrorResidency:
        """Load one residency (oldest first: `WorkerIndex.residencies` is in last-store order)."""
        res = self.index.add_residency(session_id, last_store)
        res.last_store_text = repr(last_store)
        lost, block_size, res.frontier, res.position = progress
        self.index.load_losses(res, lost, block_size)
        return res

    # -- writes: each mutates the copy and returns the Plan that makes Redis agree ---------

    def apply(
        self,
        batch: Batch,
        outcome: ApplyOutcome,
        token: str,
        now: float,
        *,
        last: bool = True,
        into: Plan | None = None,
    ) -> Plan:
        """The batch's delta for an APPLIED or RESTARTED outcome, in a Plan of its own or
        after what `into` holds (the run's batches before it, then returned).

        The ops follow the events in order (apply.lua replays them in order), so nothing is
        merged across events: each event's writes go straight into the Plan (entry-index
        changes as marks it writes per bucket when the call is sealed). What holds
        one value per session or per worker is written once, with its final value: the
        touched residencies, their last-seen scores, the counts, fence and version (with the
        version log's entries in one LPUSH). That is once per batch, or, for a run of batches
        landing in one call (`last` False for all but its last), once per run: their keys are
        not among the ones a clear deletes, so writing them after the run's other ops leaves
        what writing each batch's in turn would.
        """
        plan = Plan(self.keys) if into is None else into
        index = self.index
        touched = self._touched
        index.begin()
        if outcome is ApplyOutcome.RESTARTED:
            self._clear_in(plan, touched)
        ts = batch.ts
        text = repr(ts)
        stored: dict[str, None] = {}
        for event in merged_removals(batch.events):
            kind = event.kind  # not isinstance: see EntriesStored.kind
            if kind == STORED:
                self._store_in(plan, cast(EntriesStored, event), ts, text, stored, touched)
            elif kind == REMOVED:
                removed = cast(EntriesRemoved, event)
                part = index.part(removed.medium, removed.group_idx)
                if part is not None:
                    if part.pending:
                        self._confirm_in(plan, part, removed.block_hashes)
                    self._remove_in(plan, part, removed.block_hashes, touched)
            else:
                self._clear_in(plan, touched)
        index.fence = fence = advance(index.fence, outcome, batch.seq, ts)
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
            self._write_residencies(plan, self._touched)
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

    def _write_residencies(self, plan: Plan, touched: dict[str, MirrorResidency]) -> None:
        args: list[Arg] = []
        for sid, res in touched.items():
            args += (sid, res.value())
        plan.call(HSET, self.keys.res, args)

    def _store_in(
        self,
        plan: Plan,
        event: EntriesStored,
        ts: float,
        text: str,
        stored: dict[str, None],
        touched: dict[str, MirrorResidency],
    ) -> None:
        index = self.index
        fields = stored_fields(event)
        hashes, medium, group_idx, _, _, _, tokens = fields
        part = index.part(medium, group_idx)
        if part is None:
            part = index.new_part(medium, group_idx)
            plan.call(HSET, self.keys.parts, [part.pid, encode_part(part.medium, part.group)])
        if part.pending:
            self._confirm_in(plan, part, hashes)
        part, res, added, fresh, adopted = index.store(fields, ts)
        if tokens:
            self._link_in(plan, fields)
        if res is None:
            if added:
                plan.set_indexed(part.orphans_key, part.entry_keys, added, into=True)
            return
        if res.last_store == ts:
            res.last_store_text = text
        sid = res.session_id
        stored[sid] = None
        touched[sid] = res  # its lost blocks and frontier change with every store
        if adopted:
            plan.call(SREM, part.orphans_key, members(adopted))
        if added:
            key = res.set_keys.get(part.pid) or self._key(res, part.pid)
            held = member_texts(added)
            plan.call(SADD, key, held)
            if len(fresh) == len(added):  # all new to the worker: the common case
                plan.index(part.entry_keys, added, held, into=True)
            elif fresh:
                plan.index(part.entry_keys, fresh, member_texts(fresh), into=True)

    def _link_in(self, plan: Plan, fields: StoredFields) -> None:
        """Dynamo's edges a store adds (store/tokens.py), into the worker's edge hash."""
        linked = self.index.link(fields)
        if linked:
            args: list[Arg] = []
            for h, key in linked:
                args += (edge_field(key), member(h))
            plan.call(HSET, self.keys.tokens, args)

    def _unlink_in(self, plan: Plan, unlinked: list[tuple[int, Edge]]) -> None:
        if unlinked:
            plan.call(HDEL, self.keys.tokens, [edge_field(key) for _, key in unlinked])

    def _confirm_in(self, plan: Plan, part: RedisPart, hashes: list[Hash]) -> None:
        gone = self.index.confirm(part, hashes)
        if gone:
            plan.call(SREM, part.unconfirmed_key, members(gone))

    def _remove_in(
        self, plan: Plan, part: RedisPart, hashes: list[Hash], touched: dict[str, MirrorResidency]
    ) -> None:
        """Removals, grouped per set, each member also out of the entry index: every entry
        gone was an orphan or held by a session (a holder set has two or more), so the sets'
        SREMs name each once at least; a set losing one member (the common case: evicted
        blocks of many sessions) goes in one REMOVE1 op with the others (two args each)."""
        out = self.index.remove(part, hashes, lost=True)
        self._unlink_in(plan, out.unlinked)
        entry_keys = part.entry_keys
        orphans = out.orphans()
        if orphans:
            plan.set_indexed(part.orphans_key, entry_keys, orphans, into=False)
        sessions = out.sessions()
        if not sessions:
            return
        pid = part.pid
        residencies = self.index.residencies
        single_keys: list[str] = []
        singles: list[Hash] = []
        for sid, group in sessions.items():
            res = residencies[sid]
            key = res.set_keys.get(pid) or self._key(res, pid)
            if len(group) == 1:
                single_keys.append(key)
                singles.append(group[0])
            else:
                plan.set_indexed(key, entry_keys, group, into=False)
            touched[sid] = res
        if singles:
            plan.remove1(single_keys, singles, entry_keys)

    def _clear_in(self, plan: Plan, touched: dict[str, MirrorResidency]) -> None:
        emptied = self.index.clear()
        plan.delete(self._cleared_keys(emptied))
        for res, _ in emptied:
            touched[res.session_id] = res

    def _cleared_keys(self, emptied: list[tuple[MirrorResidency, list[int]]]) -> list[str]:
        """What a clear deletes: the emptied residencies' session sets, and every part's
        orphans, unconfirmed entries and entry index."""
        keys = [self._key(res, pid) for res, pids in emptied for pid in pids]
        keys.append(self.keys.tokens)
        for part in self.index.by_pid.values():
            keys += (part.orphans_key, part.unconfirmed_key)
            keys += part.entry_keys
        return keys

    def mark_unconfirmed(self, token: str) -> tuple[Plan, int]:
        """Copy every part's entries to its unconfirmed set (SUNIONSTORE, server side)."""
        plan = Plan(self.keys)
        index = self.index
        index.mark_unconfirmed()
        for part in index.by_pid.values():
            if part.pending:
                pid = part.pid
                sources = [self._key(r, pid) for r in index.residencies.values() if r.holds_in(pid)]
                plan.union_store(part.unconfirmed_key, [*sources, part.orphans_key])
            else:
                plan.delete([part.unconfirmed_key])
        self._finish(plan, token, "", [])
        return plan, index.unconfirmed()

    def drop_unconfirmed(self, token: str) -> tuple[Plan, int]:
        """Remove the still-unconfirmed entries from the worker and their sessions (with the
        change-feed record of the residencies that lost blocks, as for a batch)."""
        index = self.index
        index.begin()
        dropped = 0
        deletes: list[str] = []
        removals: dict[str, list[Hash]] = {}
        touched: dict[str, MirrorResidency] = {}
        unlinked: list[tuple[int, Edge]] = []
        for part, pending in index.take_unconfirmed():
            dropped += len(pending)
            deletes.append(part.unconfirmed_key)
            out = index.remove(part, pending, lost=False)
            unlinked += out.unlinked
            for h in out.gone():
                removals.setdefault(part.entry_keys[bucket(h)], []).append(h)
            orphans = out.orphans()
            if orphans:
                removals[part.orphans_key] = orphans
            for sid, group in out.sessions().items():
                res = touched[sid] = index.residencies[sid]
                removals[self._key(res, part.pid)] = group
        plan = Plan(self.keys)
        if deletes:
            plan.delete(deletes)
        for key, gone in removals.items():
            plan.call(SREM, key, members(gone))
        self._unlink_in(plan, unlinked)
        if touched:
            self._write_residencies(plan, touched)
        self._feed_in(plan, self._engine_time(), losses=False)
        self._finish(plan, token, "", [])
        return plan, dropped

    def clear(self, token: str) -> Plan:
        """Drop every entry; fence, parts and the seen sessions stay, and every residency
        holds its blocks as lost (`WorkerIndex.clear`). Every residency holding blocks ends
        in the change feed with 0 blocks."""
        index = self.index
        index.begin()
        emptied = index.clear()
        plan = Plan(self.keys)
        plan.delete(self._cleared_keys(emptied))
        if emptied:
            self._write_residencies(plan, {res.session_id: res for res, _ in emptied})
        self._feed_in(plan, self._engine_time(), losses=True)
        self._finish(plan, token, "", [])
        return plan

    def remove(self) -> Plan:
        """Delete every key of the worker."""
        index = self.index
        index.begin()
        deletes = self._cleared_keys(index.clear())
        index.residencies.clear()
        keys = self.keys
        plan = Plan(keys)
        plan.delete(
            [
                *deletes,
                keys.meta,
                keys.vlog,
                keys.parts,
                keys.seen,
                keys.res,
                keys.feed,
                keys.firsts,
            ]
        )
        return plan

    def expire(self, due: list[tuple[MirrorResidency, dict[int, list[Hash]]]], token: str) -> Plan:
        """Drop the residencies `due`, each with its entries per part as Redis holds them
        (the session sets, read by the caller): an entry no other session holds stays on the
        worker as one no session holds (the part's orphans); the session sets, the residency
        and its seen score go. One feed row per residency that held blocks, as for the stale
        policy's drops (not losses)."""
        plan = Plan(self.keys)
        index = self.index
        index.begin()
        deletes: list[str] = []
        for res, held in due:
            for pid, orphans in index.drop(res, held).items():
                if orphans:
                    plan.call(SADD, index.by_pid[pid].orphans_key, members(orphans))
                deletes.append(self._key(res, pid))
        if deletes:
            plan.delete(deletes)
        sids = [res.session_id for res, _ in due]
        plan.call(HDEL, self.keys.res, sids)
        plan.call(ZREM, self.keys.seen, sids)
        self._feed_in(plan, self._engine_time(), losses=False)
        self._finish(plan, token, "", [])
        return plan

    # -- the delta ---------------------------------------------------------------------

    def _key(self, res: MirrorResidency, pid: int) -> str:
        key = res.set_keys.get(pid)
        if key is None:
            key = res.set_keys[pid] = self.keys.session(pid, res.session_id)
        return key

    def _engine_time(self) -> float:
        """A change no batch made: the worker's last engine time, as store.memory has it."""
        fence = self.index.fence
        return fence.last_ts if fence is not None else time.time()

    def _feed_in(self, plan: Plan, ts: float, *, losses: bool) -> None:
        """The write's change-feed record (`WorkerIndex.rows`), as store.memory publishes it
        (`losses`: see `FeedRecord.losses`), if it changed a residency."""
        rows = self.index.rows()
        if rows:
            worker = self.keys.worker
            record = FeedRecord(worker.pod, worker.dp_rank, ts, rows, losses=losses)
            plan.call(
                XADD,
                self.keys.feed,
                ["MAXLEN", "~", self.feed_length, "*", "r", _ENCODER.encode(record)],
            )

    def _build_index(self, plan: Plan) -> None:
        """The whole entry index, from the holders: once per worker written before it existed
        (O(worker entries)), and on a new worker's first write (SADDs of what it just added)."""
        for part in self.index.by_pid.values():
            buckets: dict[int, list[Hash]] = {}
            for h in part.holders:
                b = bucket(h)
                group = buckets.get(b)
                if group is None:
                    buckets[b] = [h]
                else:
                    group.append(h)
            for b, group in buckets.items():
                plan.call(SADD, part.entry_keys[b], members(group))
        self.indexed = True

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
        index = self.index
        plan.call(
            HSET,
            self.keys.meta,
            [
                "ver",
                token,
                "blocks",
                index.entries(),
                "sessions",
                index.active,
                "unconfirmed",
                index.unconfirmed(),
                *loss_fields(index.losses()),
                *meta,
            ],
        )
        log, self._log = self._log, []
        plan.call(LPUSH, self.keys.vlog, log)  # the newest ends first
        if self.writes // VLOG_LENGTH != (self.writes - len(log)) // VLOG_LENGTH:
            # Trimmed once per VLOG_LENGTH writes, not each: the list stays under twice that
            # per writer, for one command in VLOG_LENGTH.
            plan.call(LTRIM, self.keys.vlog, [0, VLOG_LENGTH - 1])
