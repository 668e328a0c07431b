"""A reader's cache of one field of every registered worker's meta (its state, its model), and
the rule that reads the states log: no I/O here (`RedisReader` drives both).

Imports neither zmq nor fastapi. Every route reads the states, and a route restricted to a
model the models: read per request, or every worker's on each refresh, they cost a read of
the whole fleet (bench/README.md, api_background.py). Kept for `registry_ttl`, a refresh
then asks the states log which workers' status changed since the count the cache is up to,
and reads those workers' field again, and those of workers that registered since.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Generic, NamedTuple, TypeVar

from kvsi.store.model import WorkerKey
from kvsi.store.redis.known_workers import KnownWorkers
from kvsi.store.redis.layout import parse_worker

T = TypeVar("T")


class FieldCache(Generic[T]):
    """One meta field of every registered worker, as this reader last read it.

    `values` is the same mapping object until a value changes or a worker comes or goes, so
    callers derive from it once per change (api/candidates.py). `counter` is the states
    counter the values are up to: every status change logged after it names its worker in
    the states log. `read_at`: when every worker's value was last read (the log cannot tell
    of a writer that died between a status and its log entry).
    """

    def __init__(self, field: str, parse: Callable[[bytes | None], T]) -> None:
        self.field = field
        self.parse = parse
        self.values: Mapping[WorkerKey, T] = MappingProxyType({})
        self.at = -math.inf
        """When the values were last found current (monotonic)."""
        self.counter = 0
        self.entry: bytes | None = None
        """The states log's entry for `counter` (its id), if it had one."""
        self.read_at = -math.inf
        self._covered = -1
        """The registry version `values` was last found to cover."""

    def due(self, now: float, ttl: float) -> bool:
        return now - self.at >= ttl

    def covers(self, registry: KnownWorkers) -> bool:
        """Whether every registered worker has a value: checked once per registry change."""
        if registry.version == self._covered:
            return True
        if all(map(self.values.__contains__, registry.ordered())):
            self._covered = registry.version
            return True
        return False

    def missing(self, registry: KnownWorkers) -> list[WorkerKey]:
        return [w for w in registry.ordered() if w not in self.values]

    def keep(self, values: Mapping[WorkerKey, T], at: float) -> None:
        """The values read at `at` (the same mapping object as before if they are the same)."""
        if values != self.values:
            self.values = MappingProxyType(dict(values))
            self._covered = -1
        self.at = at

    def patch(
        self, workers: Iterable[WorkerKey], found: Mapping[WorkerKey, bytes | None], at: float
    ) -> None:
        """`workers`' values read again at `at` (`found`: those whose meta still exists)."""
        values = dict(self.values)
        for w in workers:
            if w in found:
                values[w] = self.parse(found[w])
            else:  # removed by another process since
                values.pop(w, None)
        self.keep(values, at)

    def expire(self) -> None:
        """Due at the next read (this process wrote a value another may not know yet)."""
        self.at = -math.inf

    def registered(self, registry: KnownWorkers) -> Mapping[WorkerKey, T]:
        """The values of the registered workers: `values` itself once it covers them, the
        workers gone since left out of it once (so callers get the same mapping again)."""
        values, workers = self.values, registry.ordered()
        if not self.covers(registry):
            return {w: values[w] for w in workers if w in values}
        if len(values) != len(workers):
            self.keep({w: values[w] for w in workers}, self.at)
            self._covered = registry.version
        return self.values

    @property
    def up_to(self) -> tuple[int, bytes | None]:
        """The count the values are up to, and its log entry: a read that finds them moved
        when it ends was overtaken by another, whose values may be older than its own start."""
        return self.counter, self.entry

    def logged(self, logged: Logged) -> None:
        self.counter, self.entry = logged.counter, logged.entry


class Logged(NamedTuple):
    """What states_since.lua answered, checked against what a cache is up to."""

    counter: int
    entry: bytes | None
    """The id of the log's entry for `counter`, if it has one (else a writer did not log)."""
    workers: list[WorkerKey] | None
    """The workers the log names after the cache's count; None if it cannot tell them all."""


def read_log(reply: Sequence[Any], count: int | None, entry: bytes | None) -> Logged:
    """states_since.lua's `reply` for a cache up to `count` (whose log entry is `entry`), or
    for a read of every worker (`count` None)."""
    counter = int(reply[0])
    entries = [(raw_id, _entry(fields)) for raw_id, fields in reply[1]]
    newest = entries[0][0] if entries and entries[0][1][0] == counter else None
    if count is None:
        return Logged(counter, newest, None)
    if entry is None:  # nothing to check the log against: trusted while the counter stays
        return Logged(counter, newest, [] if counter == count else None)
    counts = [n for _, (n, _) in entries]
    if not entries or counts != list(range(counter, count - 1, -1)) or entries[-1][0] != entry:
        return Logged(counter, newest, None)
    return Logged(counter, newest, sorted({w for _, (_, w) in entries[:-1]}))


def _entry(fields: Sequence[bytes]) -> tuple[int, WorkerKey]:
    """A states log entry's count and worker."""
    entry = dict(zip(fields[0::2], fields[1::2], strict=True))
    return int(entry[b"n"]), parse_worker(entry[b"w"])
