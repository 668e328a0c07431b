"""The registry of workers as one reader process knows it (`KnownWorkers`): no I/O here
(`RedisReader` reads the registry and keeps this up to date; `FieldCache` checks itself
against it).

Imports neither zmq, fastapi nor redis.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvsi.store.model import WorkerKey


class KnownWorkers:
    """The registry as this process knows it: the workers, the same in order (sorted again
    only after a change) and a version that moves with every change, so a read's per-worker
    caches are checked once per change, not once per request."""

    def __init__(self, workers: Iterable[WorkerKey] = ()) -> None:
        self._workers = set(workers)
        self._ordered: tuple[WorkerKey, ...] | None = None
        self.version = 0

    def __contains__(self, worker: object) -> bool:
        return worker in self._workers

    def add(self, worker: WorkerKey) -> None:
        if worker not in self._workers:
            self._workers.add(worker)
            self._changed()

    def discard(self, worker: WorkerKey) -> None:
        if worker in self._workers:
            self._workers.discard(worker)
            self._changed()

    def replace(self, workers: set[WorkerKey]) -> None:
        if workers != self._workers:
            self._workers = workers
            self._changed()

    def ordered(self) -> tuple[WorkerKey, ...]:
        if self._ordered is None:
            self._ordered = tuple(sorted(self._workers))
        return self._ordered

    def _changed(self) -> None:
        self._ordered = None
        self.version += 1
