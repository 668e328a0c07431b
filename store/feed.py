"""The change feed: what changed in the index, in order, for routers that keep a warm view.

Imports neither zmq nor fastapi. Writers publish one record per batch (cheap: one small
untracked row per changed residency, no per-change objects on the hot path); the API's
`/v1/watch` subscribes and gets one `FeedEntry` per change. A subscriber's queue is bounded:
one that falls behind gets an overflow marker and is dropped, so a slow client never slows
ingest.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import msgspec


class ResidencyRow(msgspec.Struct, array_like=True, frozen=True, order=True, gc=False):
    """One session's change on one worker in one write: (session_id, added, removed, blocks
    now). Encoded as the 4-array a tuple was; ordered as one (session id first).

    Not tracked by the garbage collector: a write makes one per changed residency and the
    history keeps them, so tracked rows (tuples) set off a young-generation collection
    every few batches of ingest."""

    session_id: str
    added: int
    removed: int
    blocks: int


class ResidencyChange(msgspec.Struct, tag="residency", tag_field="type", frozen=True):
    """A session's residency on one worker changed in one batch."""

    session_id: str
    pod: str
    dp_rank: int
    added: int
    removed: int
    blocks: int
    """Entries of the session on that worker after the batch."""
    ts: float
    """The engine's batch time."""
    lost: int = 0
    """Of `removed`, the blocks eviction took (`SessionOnWorker.lost_blocks`): all of them,
    except those the stale policy dropped or a removed worker took with it."""


class WorkerChange(msgspec.Struct, tag="worker", tag_field="type", frozen=True):
    """A worker's state changed (live, disconnected, degraded...)."""

    pod: str
    dp_rank: int
    state: str
    since: float
    detail: str


Change = ResidencyChange | WorkerChange


class FeedRecord(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One batch's residency changes on one worker, or one worker state change.

    `changes` yields the rows in session id order, whatever order they were made in: both
    writers publish them as the write made them (no sort per batch on ingest; records of
    Redis writers before this were sorted, and read the same).

    The unit writers publish (and the Redis store puts in its stream, msgpack-encoded).
    Untracked by the garbage collector, as its rows: the history holds thousands of these,
    and tracked containers there made every collection, and so ingest, measurably slower.
    """

    pod: str
    dp_rank: int
    ts: float
    rows: tuple[ResidencyRow, ...] = ()
    state: WorkerChange | None = None
    losses: bool = False
    """The rows' removals are losses (a batch's evictions and clears, `clear_worker`): every
    removal of a batch is one, none of the stale policy's or `remove_worker`'s. One flag
    rather than a column, so records written before it read (as no losses), and it is last,
    so readers that predate it skip it."""

    def changes(self) -> Iterator[Change]:
        if self.state is not None:
            yield self.state
        losses = self.losses
        for row in sorted(self.rows):
            yield ResidencyChange(
                row.session_id,
                self.pod,
                self.dp_rank,
                row.added,
                row.removed,
                row.blocks,
                self.ts,
                row.removed if losses else 0,
            )


@dataclass(frozen=True, slots=True)
class FeedEntry:
    """A change with its id: the SSE event id a client resumes after (Last-Event-ID)."""

    id: str
    change: Change


class Overflow(Exception):
    """The subscriber fell too far behind and was dropped."""


class HistoryGone(Exception):
    """`after` is not in the bounded history (older than it, or ahead of it): the client
    must re-read the index."""


def entry_id(record_id: str, index: int) -> str:
    """A change's id: its record's id and its place in the record."""
    return f"{record_id}.{index}"


def split_id(event_id: str) -> tuple[str, int]:
    """Inverse of `entry_id`; ValueError for an id this feed did not hand out."""
    record_id, sep, index = event_id.rpartition(".")
    if not sep or not record_id or not index.isdigit():
        raise ValueError(f"event id {event_id!r} is not one of this feed's ids")
    return record_id, int(index)


@dataclass(eq=False)
class Subscription:
    """One watcher's bounded queue of entries, filtered by session ids and pods."""

    sessions: frozenset[str] | None
    pods: frozenset[str] | None
    limit: int
    queue: asyncio.Queue[FeedEntry | None] = field(default_factory=asyncio.Queue)
    overflowed: bool = False

    def wants_record(self, record: FeedRecord) -> bool:
        return self.pods is None or record.pod in self.pods

    def wants(self, change: Change) -> bool:
        if self.sessions is None:
            return True
        return isinstance(change, ResidencyChange) and change.session_id in self.sessions

    def offer(self, entry: FeedEntry) -> None:
        if self.overflowed:
            return
        if self.queue.qsize() >= self.limit:
            self.overflowed = True
            self.queue.put_nowait(None)
        else:
            self.queue.put_nowait(entry)

    async def next(self) -> FeedEntry:
        """The next entry; raises Overflow once the queue overflowed."""
        entry = await self.queue.get()
        if entry is None:
            raise Overflow
        return entry


class FeedHub:
    """In-process fan-out of records with a bounded history.

    Record ids are this process's counter (`publish`), or the ids a Redis Stream gave them
    (`deliver`: then every API replica agrees on them and a client may resume on another).
    Publishing never blocks and builds no per-change objects unless someone subscribes.
    """

    def __init__(self, history: int = 10_000, queue_size: int = 1_000) -> None:
        self._history: deque[tuple[str, FeedRecord]] = deque(maxlen=history)
        self._subscribers: set[Subscription] = set()
        self._counter = itertools.count(1)
        self.queue_size = queue_size

    def publish(self, record: FeedRecord) -> None:
        """Number and deliver a record made in this process."""
        self.deliver(str(next(self._counter)), record)

    def deliver(self, record_id: str, record: FeedRecord) -> None:
        """Record and fan out a record that already carries its id, in order."""
        self._history.append((record_id, record))
        if self._subscribers:
            for sub in self._subscribers:
                self._offer(sub, record_id, record, start=0)

    def subscribe(
        self,
        *,
        after: str | None,
        sessions: frozenset[str] | None = None,
        pods: frozenset[str] | None = None,
    ) -> Subscription:
        """A new subscription, first fed the history after event id `after` (if given).

        Raises HistoryGone when `after` is not in the history any more (or never was).
        """
        sub = Subscription(sessions, pods, self.queue_size)
        if after is not None:
            for record_id, record, start in self._backlog(after):
                self._offer(sub, record_id, record, start)
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscribers.discard(sub)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    @staticmethod
    def _offer(sub: Subscription, record_id: str, record: FeedRecord, start: int) -> None:
        if sub.overflowed or not sub.wants_record(record):
            return
        for index, change in enumerate(record.changes()):
            if index >= start and sub.wants(change):
                sub.offer(FeedEntry(entry_id(record_id, index), change))

    def _backlog(self, after: str) -> Iterator[tuple[str, FeedRecord, int]]:
        try:
            record_id, index = split_id(after)
        except ValueError as exc:
            raise HistoryGone(str(exc)) from None
        history = list(self._history)
        for i, (rid, record) in enumerate(history):
            if rid == record_id:
                yield rid, record, index + 1
                yield from ((r, rec, 0) for r, rec in history[i + 1 :])
                return
        raise HistoryGone(_not_in_history(after, record_id, [rid for rid, _ in history]))


def _not_in_history(after: str, record_id: str, history: list[str]) -> str:
    """Why a resume point is not in the history: older than it, or ahead of it (an id from
    before a restart of this feed, or from another feed), said as such."""
    if not history:
        return f"event id {after!r} is not in this feed, which holds no event yet"
    asked = _position(record_id)
    if asked is not None:
        stream, place = asked
        held = [p[1] for p in map(_position, history) if p is not None and p[0] == stream]
        if held and place > max(held):
            return (
                f"event id {after!r} is ahead of this feed (newest record {history[-1]!r}): "
                "it comes from before a restart of the feed, or from another feed"
            )
        if held and place < min(held):
            return f"event id {after!r} is older than the last {len(history)} records"
    return f"event id {after!r} is not in this feed's last {len(history)} records"


def _position(record_id: str) -> tuple[str, tuple[int, ...]] | None:
    """(stream, place in it) of a record id: `12` (this process's counter) or
    `pod/0@1700000000000-3` (a worker's Redis Stream entry); None for any other text."""
    stream, _, place = record_id.rpartition("@")
    parts = place.split("-")
    if not all(part.isdigit() for part in parts):
        return None
    return stream, tuple(int(part) for part in parts)
