"""One worker's index in process memory: the rules both the memory store and the Redis writer drive.

Imports neither zmq, fastapi nor redis, nor any store backend: `store.memory` is this core
plus reads, `store.redis.mirror` this core plus the Redis plan of each write. Its records
(parts, residencies, holders) are in store/records.py.

What it keeps, per worker: the reverse map (per part, entry -> the sessions holding it), each
session residency (its count per part, last store, losses and frontier), the entries held
over an unrepaired gap, the fence, and what the write being applied changed (the change
feed's rows). Residencies keep counts, not their hashes: the reverse map already says which
session holds what, so a store or a removal touches one map per hash, not two. Reading a
session's hashes back (`holdings`) walks the worker's entries instead: reads rare enough
for that, the memory store's `session_blocks` and expiry (the Redis writer reads the
session sets from Redis).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Final, Generic, TypeVar, cast

from msgspec.structs import astuple

from kvsi.store.feed import ResidencyRow
from kvsi.store.model import (
    DEFAULT_MEDIUM,
    REMOVED,
    EntriesRemoved,
    EntriesStored,
    Fence,
    Hash,
    StoreEvent,
    WorkerLosses,
    idle,
    release,
)
from kvsi.store.records import ABSENT, Holders, Part, Removed, Residency
from kvsi.store.tokens import Edge, TokenTree


def merged_removals(events: list[StoreEvent]) -> list[StoreEvent]:
    """`events` with each run of consecutive removals from one part (medium and group) as
    one removal of all their hashes, in order; the list itself when there is no such run.

    vLLM publishes one BlockRemoved per evicted block (a busy engine's batch holds runs of
    several), and each removal costs the writers a call with its bookkeeping: one removal
    of them all leaves the same index, losses and feed row as removing each in turn (a hash
    named twice is simply not held the second time), at a fraction of the cost.
    """
    out: list[StoreEvent] = []
    last: EntriesRemoved | None = None  # the removal `out` ends with
    grown: list[Hash] | None = None  # its hashes once merged, grown in place
    for cls, run in itertools.groupby(events, type):  # runs of one type, found by C loops
        if cast("type[StoreEvent]", cls).kind != REMOVED:  # once a run (decoder subclasses)
            out += run
            last = grown = None
            continue
        for event in cast("Iterator[EntriesRemoved]", run):  # its key: the events' type
            if (
                last is not None
                and event.medium == last.medium
                and event.group_idx == last.group_idx
            ):
                if grown is None:
                    grown = list(last.block_hashes)
                    out[-1] = EntriesRemoved(grown, last.medium, last.group_idx)
                grown += event.block_hashes
            else:
                out.append(event)
                last = event
                grown = None
    return out if len(out) < len(events) else events


P = TypeVar("P", bound=Part)
R = TypeVar("R", bound=Residency)


class WorkerIndex(Generic[P, R]):
    """One worker's entries, holders, residencies and fence; the writes both backends apply.

    A write starts with `begin` and ends with `rows`, the change feed's record of it. The
    backend makes parts and residencies through the two factories (each adds what it keeps
    beside them: Redis key names, the session a residency belongs to).
    """

    def __init__(
        self,
        new_part: Callable[[int, str, int], P],
        new_residency: Callable[[str], R],
    ) -> None:
        self._new_part = new_part
        self._new_residency = new_residency
        self._by_wire: dict[str | None, dict[int | None, P]] = {}
        """Parts by the (medium, group_idx) an event names, each of vLLM's unset values under
        what it means too: a store finds its part in two lookups, building no key."""
        self._last: tuple[str | None, int | None, P] | None = None
        """The (medium, group_idx) the last `part` call named, and its part: a worker's
        events name one part, mostly, and comparing a short string costs less than hashing
        it (a decoded medium is a new string each time)."""
        self.by_pid: dict[int, P] = {}
        self.residencies: dict[str, R] = {}
        """In the order of their last store (a store moves its residency to the end): the
        idle ones come first, so expiry reads only what it drops."""
        self.active = 0
        """Residencies holding at least one entry: the worker's `sessions` count."""
        self.fence: Fence | None = None
        self._batch = 0
        self._changed: list[Residency] = []
        """Residencies whose entries the current write changed, for the change feed."""
        self._closed: list[ResidencyRow] = []
        """Rows of residencies the current write ended (a clear, an expiry)."""
        self.tokens = TokenTree()
        """Dynamo's edges of the entries (empty unless stores carry `tokens_hashes`)."""
        self.hurt = 0
        """Residencies that lost entries since their last store; `lost_blocks` and
        `lost_tokens` their sums (`losses`), kept as each residency's `lost` changes, so
        that reading them costs nothing per residency."""
        self.lost_blocks = 0
        self.lost_tokens = 0

    # -- parts and residencies ------------------------------------------------------------

    def part(self, medium: str | None, group: int | None) -> P | None:
        """The part of an event's (medium, group_idx), vLLM's None meaning GPU and 0."""
        last = self._last
        if last is not None and last[0] == medium and last[1] == group:
            return last[2]
        groups = self._by_wire.get(medium)
        part = None if groups is None else groups.get(group)
        if part is not None:
            self._last = (medium, group, part)
        return part

    def add_part(self, pid: int, medium: str, group: int) -> P:
        self._last = None
        part = self.by_pid[pid] = self._new_part(pid, medium, group)
        for name in (medium, None, "") if medium == DEFAULT_MEDIUM else (medium,):
            groups = self._by_wire.setdefault(name, {})
            groups[group] = part
            if group == 0:
                groups[None] = part
        return part

    def new_part(self, medium: str | None, group: int | None) -> P:
        """A part the worker did not have, named by the next part id."""
        return self.add_part(len(self.by_pid), medium or DEFAULT_MEDIUM, group or 0)

    def add_residency(self, session_id: str, last_store: float) -> R:
        """A residency at the end of the last-store order (a load adds them oldest first)."""
        res = self._new_residency(session_id)
        res.last_store = last_store
        self.residencies[res.session_id] = res
        return res

    def load_losses(self, res: R, lost: int, block_size: int | None) -> None:
        """A loaded residency's lost entries and block size, as read back from a store."""
        self._forgive(res)
        res.block_size = block_size
        self._lose(res, lost)

    def losses(self) -> WorkerLosses:
        """What eviction took from the worker's residencies: O(1)."""
        return WorkerLosses(
            sessions_hurt=self.hurt,
            lost_blocks=self.lost_blocks,
            reprefill_tokens=self.lost_tokens,
        )

    def _lose(self, res: Residency, blocks: int) -> None:
        """`res` lost `blocks` more entries; the worker's sums count them."""
        if blocks:
            if not res.lost:
                self.hurt += 1
            res.lost += blocks
            self.lost_blocks += blocks
            self.lost_tokens += blocks * (res.block_size or 0)

    def _forgive(self, res: Residency) -> None:
        """`res` has lost nothing since (a store, a drop); the worker's sums no longer
        count what it had lost. Its block size changes only while it has lost nothing."""
        lost = res.lost
        if lost:
            self.hurt -= 1
            self.lost_blocks -= lost
            self.lost_tokens -= lost * (res.block_size or 0)
            res.lost = 0

    def idle(self, older_than: float, limit: int) -> list[R]:
        """Up to `limit + 1` residencies, least recently stored first, while `idle`."""
        return list(
            itertools.takewhile(
                lambda r: idle(r.last_store, older_than),
                itertools.islice(self.residencies.values(), limit + 1),
            )
        )

    def entries(self) -> int:
        return sum(len(p.holders) for p in self.by_pid.values())

    def holds(self, h: Hash) -> bool:
        """Whether any part holds the entry `h`."""
        return any(h in part.holders for part in self.by_pid.values())

    def missing(self, hashes: Iterable[Hash]) -> set[Hash]:
        """Those of `hashes` no part holds: set differences (C loops), not a lookup each."""
        left = set(hashes)
        for part in self.by_pid.values():
            if not left:
                break
            left = left.difference(part.holders)
        return left

    def unconfirmed(self) -> int:
        return sum(len(p.pending) for p in self.by_pid.values())

    # -- writes ---------------------------------------------------------------------------

    def begin(self) -> None:
        """Start a write: the change feed's rows count its changes from here."""
        self._batch += 1
        self._changed = []
        self._closed = []

    def rows(self) -> tuple[ResidencyRow, ...]:
        """The change feed's rows of the write: one per session whose entries it changed,
        (session, added, removed, entries now), in no particular order (`FeedRecord` sorts
        them when read); a residency a clear ended mid-write has its own row with 0
        entries, and a later store a second row."""
        rows = self._closed
        if self._changed:
            row = ResidencyRow  # an imported name: looked up once here, not once a row
            rows += [row(r.session_id, r.added, r.removed, r.total) for r in self._changed]
            self._changed = []
        self._closed = []
        return tuple(rows)

    def confirm(self, part: Part, hashes: list[Hash]) -> set[Hash]:
        """Entries an event names are confirmed (no longer pending); returns those that were."""
        gone = part.pending.intersection(hashes)
        if gone:
            part.pending -= gone
        return gone

    def store(
        self, fields: StoredFields, ts: float
    ) -> tuple[P, R | None, list[Hash], list[Hash], list[Hash] | None]:
        """Apply a store at engine time `ts`: the part gains the entries, the session's
        residency (moved to the end of the last-store order when `ts` is its latest) holds
        them, nothing is lost since and its frontier moves (`Frontier`). Unconfirmed
        entries it names are confirmed first (`confirm`, by the caller if it must know
        which).

        Returns (part, residency or None for a store of no session, entries new to the
        residency (of no session: new to the worker), of those the ones new to the worker,
        of those the ones no session held before (adopted orphans; None if none)).
        """
        # The hot path of ingest: lookups are inlined rather than factored into helpers.
        hashes, medium, group_idx, sid, parent, size, _ = fields
        part = self.part(medium, group_idx)
        if part is None:
            part = self.new_part(medium, group_idx)
        if part.pending:
            self.confirm(part, hashes)
        holders = part.holders
        if sid is None:
            new = list(dict.fromkeys(h for h in hashes if h not in holders))
            holders.update(dict.fromkeys(new))
            return part, None, new, new, None
        residencies = self.residencies
        res = residencies.get(sid)
        if res is None:
            res = self.add_residency(sid, max(ts, 0.0))
        elif ts > res.last_store:
            res.last_store = ts
            key = res.session_id
            del residencies[key]  # to the end: the dict stays in last-store order
            residencies[key] = res
        lost = res.lost
        if lost:  # `_forgive`, inlined
            self.hurt -= 1
            self.lost_blocks -= lost
            self.lost_tokens -= lost * (res.block_size or 0)
            res.lost = 0
        if size is not None and size != res.block_size:
            res.block_size = size
        if hashes:  # the frontier moves (`Frontier`'s rules)
            last = hashes[-1]
            if parent is None:  # the store starts the prompt
                res.position = len(hashes) - 1
            elif parent == res.frontier:  # the chain goes on
                if res.position is not None:
                    res.position += len(hashes)
            elif last != res.frontier:  # not the same blocks in another part: unknown
                res.position = None
            res.frontier = last
        adopted = None
        n = _hold_new(holders, res, hashes)
        if n == len(hashes):  # all new to the worker: the common case
            added = fresh = hashes
        elif not n and _holds_all(holders, res, hashes):  # a reuse report of what it holds
            return part, res, [], [], None
        else:
            added, fresh, adopted = _hold_each(holders, res, hashes, n)
            n = len(added)
        if n:
            if not res.total:
                self.active += 1
            res.total += n
            pid = part.pid
            if pid:
                others = res.in_others
                others[pid] = others.get(pid, 0) + n
            else:
                res.in_first += n
            if res.batch != self._batch:
                res.batch = self._batch
                res.added = res.removed = 0
                self._changed.append(res)
            res.added += n
        return part, res, added, fresh, adopted

    def link(self, fields: StoredFields) -> list[tuple[int, Edge]]:
        """Dynamo's edges of a store's blocks (after `store`), if it names their tokens."""
        hashes, _, _, _, parent, _, tokens = fields
        if not tokens:
            return []
        return self.tokens.link(parent, hashes, tokens)

    def remove(self, part: Part, hashes: Collection[Hash], *, lost: bool) -> Removed:
        """Entries leave the worker and their sessions, as lost blocks of those sessions
        (eviction) or not (`lost` False: the stale policy's drops). Dynamo's edges of
        those no part holds any more go too (`Removed.unlinked`)."""
        holders = part.holders
        popped: list[Holders | bool] = []
        losers: list[Residency] = []  # in order of first loss, each counting its `dropping`
        try:
            for h in hashes:
                cur = _pop(holders, h, False)
                popped.append(cur)
                if isinstance(cur, Residency):
                    if not cur.dropping:
                        losers.append(cur)
                    cur.dropping += 1
                elif isinstance(cur, set):
                    for res in cur:
                        if not res.dropping:
                            losers.append(res)
                        res.dropping += 1
            self._drop(losers, part.pid, lost=lost)
        finally:
            for res in losers:
                res.dropping = 0
        out = Removed(hashes, popped)
        if self.tokens.edge:
            out.unlinked = self.tokens.unlink(hashes, self.holds)
        return out

    def _drop(self, losers: list[Residency], pid: int, *, lost: bool) -> None:
        """Each of `losers` loses its `dropping` entries of part `pid`; the worker's loss
        sums count them (`_lose` of each, summed)."""
        batch = self._batch
        hurt = blocks = tokens = 0
        for res in losers:
            n = res.dropping
            if pid:
                _uncount_other(res.in_others, pid, n)
            else:
                res.in_first -= n
            res.total -= n
            if lost:
                if not res.lost:
                    hurt += 1
                res.lost += n
                blocks += n
                size = res.block_size
                if size:
                    tokens += n * size
            if not res.total:
                self.active -= 1
            if res.batch != batch:
                res.batch = batch
                res.added = res.removed = 0
                self._changed.append(res)
            res.removed += n
        if blocks:
            self.hurt += hurt
            self.lost_blocks += blocks
            self.lost_tokens += tokens

    def clear(self) -> list[tuple[R, list[int]]]:
        """Every entry gone (the engine's cache emptied: a restart, `WorkerCleared`, a worker
        cleared). Residencies stay, their entries counted as lost (a next turn prefills them
        again); each that held entries or changed in this write ends its feed row here.
        Returns those that held entries, with the part ids they held entries in."""
        emptied = []
        closed, batch = self._closed, self._batch
        for sid, res in self.residencies.items():
            if res.batch == batch:
                closed.append(ResidencyRow(sid, res.added, res.removed + res.total, 0))
                res.batch = 0  # stored again later in this write: a new row
            elif res.total:
                closed.append(ResidencyRow(sid, 0, res.total, 0))
            if res.total:
                emptied.append((res, list(res.counts())))
                res.in_first = 0
                res.in_others.clear()
                self._lose(res, res.total)
                res.total = 0
        self._changed = []
        for part in self.by_pid.values():
            part.holders.clear()
            part.pending.clear()
        self.tokens.clear()
        self.active = 0
        return emptied

    def mark_unconfirmed(self) -> int:
        """Every entry is held over an unrepaired gap until an event names it again."""
        for part in self.by_pid.values():
            part.pending = set(part.holders)
        return self.unconfirmed()

    def take_unconfirmed(self) -> list[tuple[P, set[Hash]]]:
        """The still-unconfirmed entries per part, no longer pending (to be removed)."""
        out = []
        for part in self.by_pid.values():
            if part.pending:
                out.append((part, part.pending))
                part.pending = set()
        return out

    def drop(self, res: R, held: Mapping[int, Iterable[Hash]]) -> dict[int, list[Hash]]:
        """Drop a residency (the idle rule) whose entries per part are `held`: each entry
        stays on the worker (`release`); returns, per part, those it leaves held by none. Its
        feed row, if it held entries, removes them all (not losses)."""
        sid = res.session_id
        holder: Residency = res
        orphaned: dict[int, list[Hash]] = {}
        for pid, hashes in held.items():
            holders = self.by_pid[pid].holders
            orphans = orphaned[pid] = []
            for h in hashes:
                cur = holders.get(h, ABSENT)
                if cur is not ABSENT:
                    holders[h] = after = release(cur, holder)
                    if after is None:
                        orphans.append(h)
        if res.total:
            self.active -= 1
            self._closed.append(ResidencyRow(sid, 0, res.total, 0))
        self._forgive(res)
        del self.residencies[sid]
        return orphaned

    # -- loading and reading --------------------------------------------------------------

    def load(self, part: P, res: R, hashes: Iterable[Hash]) -> None:
        """`res` holds `hashes` in `part`, as read back from a store (no feed row)."""
        holders = part.holders
        added = 0
        for h in hashes:
            cur = holders.get(h, ABSENT)
            if cur is ABSENT or cur is None:
                holders[h] = res
            elif isinstance(cur, Residency):
                holders[h] = {cur, res}
            else:
                cur.add(res)
            added += 1
        if added:
            if not res.total:
                self.active += 1
            if part.pid:
                res.in_others[part.pid] = res.in_others.get(part.pid, 0) + added
            else:
                res.in_first += added
            res.total += added

    def load_orphans(self, part: P, hashes: Iterable[Hash]) -> None:
        """`hashes` are on the worker held by no session, as read back from a store."""
        for h in hashes:
            part.holders.setdefault(h, None)

    def holdings(self, session_ids: Collection[str]) -> dict[str, dict[int, list[Hash]]]:
        """The entries each of `session_ids` holds, per part id: O(worker entries)."""
        out: dict[str, dict[int, list[Hash]]] = {sid: {} for sid in session_ids}
        for pid, part in self.by_pid.items():
            for h, cur in part.holders.items():
                if cur is None:
                    continue
                for res in (cur,) if isinstance(cur, Residency) else cur:
                    held = out.get(res.session_id)
                    if held is not None:
                        held.setdefault(pid, []).append(h)
        return out


_pop: Final = dict.pop
"""`dict.pop`, looked up once: compiled, `holders.pop(h, False)` looks the method up on
every call."""
_astuple: Final = astuple
"""A static of the compiled module: an imported name is looked up in its globals on every
call."""

StoredFields = tuple[
    list[Hash], str | None, int | None, str | None, Hash | None, int | None, list[int] | None
]
"""`EntriesStored`'s fields, in its order."""


def stored_fields(event: EntriesStored) -> StoredFields:
    """A store's fields in one C call: compiled code reads each attribute of a Struct
    through the generic attribute lookup."""
    return cast(StoredFields, _astuple(event))


def _hold_new(holders: dict[Hash, Holders], res: Residency, hashes: list[Hash]) -> int:
    """`res` holds `hashes` for as long as each is new to the worker (a `setdefault` each:
    the look and the insert in one C call); returns how many were."""
    size = len(holders)
    held = 0
    for h in hashes:
        holders.setdefault(h, res)
        if len(holders) == size:
            return held
        size += 1
        held += 1
    return held


def _holds_all(holders: dict[Hash, Holders], res: Residency, hashes: list[Hash]) -> bool:
    """Whether `res` holds every one of `hashes` already, alone or with others: engines
    report the reuse of a whole prefix, often one several sessions share (a system prompt),
    so one look per hash, compiled to a C call."""
    for h in hashes:
        cur = holders.get(h)
        if cur is not res and (not isinstance(cur, set) or res not in cur):
            return False
    return True


def _hold_each(
    holders: dict[Hash, Holders], res: Residency, hashes: list[Hash], new: int
) -> tuple[list[Hash], list[Hash], list[Hash] | None]:
    """`store` when some hashes were on the worker already (the first `new` were not, and
    are held): one look per hash from there on."""
    fresh = hashes[:new]
    added = hashes[:new]
    adopted: list[Hash] | None = None
    for i in range(new, len(hashes)):
        h = hashes[i]
        cur = holders.get(h, ABSENT)
        if cur is ABSENT:
            holders[h] = res
            fresh.append(h)
        elif cur is None:
            holders[h] = res
            if adopted is None:
                adopted = [h]
            else:
                adopted.append(h)
        elif cur is res:
            continue
        elif isinstance(cur, Residency):
            holders[h] = {cur, res}
        elif res in cur:
            continue
        else:
            cur.add(res)
        added.append(h)
    return added, fresh, adopted


def _uncount_other(others: dict[int, int], pid: int, n: int) -> None:
    """`n` entries of part `pid` (not 0) leave a residency's `in_others`."""
    left = others[pid] - n
    if left:
        others[pid] = left
    else:
        del others[pid]
