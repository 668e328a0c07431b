"""A store wrapper for ingest tests: records every apply, and fails every call while down.

Imports the store only. It stands for any backend that can be unavailable (Redis stopped):
the memory store itself never fails.
"""

from __future__ import annotations

from collections.abc import Sequence

from store.memory import MemoryStore
from store.model import (
    ApplyOutcome,
    Batch,
    Expired,
    Fence,
    Hash,
    Page,
    SessionSummary,
    SessionView,
    WorkerKey,
    WorkerStatus,
    WorkerView,
)
from store.paging import SessionOrder


class StoreDownError(ConnectionError):
    """What the wrapper raises while down, as redis-py raises ConnectionError."""


class RecordingStore:
    """IndexStore over a MemoryStore; `applied` lists (worker, seq, outcome) per apply."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.applied: list[tuple[WorkerKey, int, ApplyOutcome]] = []
        self.statuses: list[tuple[WorkerKey, WorkerStatus]] = []
        self.down = False
        self.refused = 0
        """Calls refused while down."""

    def _check(self) -> None:
        if self.down:
            self.refused += 1
            raise StoreDownError("index store is down (test)")

    def seqs(self, worker: WorkerKey) -> list[int]:
        """Seqs of the batches the worker's applies carried, in call order."""
        return [seq for w, seq, _ in self.applied if w == worker]

    async def apply(
        self, worker: WorkerKey, batch: Batch, expect: Fence | None = None
    ) -> ApplyOutcome:
        self._check()
        outcome = await self.inner.apply(worker, batch, expect)
        self.applied.append((worker, batch.seq, outcome))
        return outcome

    async def apply_many(
        self, worker: WorkerKey, batches: Sequence[Batch], expect: Fence | None = None
    ) -> list[ApplyOutcome]:
        return [await self.apply(worker, batch, expect) for batch in batches]

    async def fence(self, worker: WorkerKey) -> Fence | None:
        self._check()
        return await self.inner.fence(worker)

    async def set_status(self, worker: WorkerKey, status: WorkerStatus) -> None:
        self._check()
        self.statuses.append((worker, status))
        await self.inner.set_status(worker, status)

    async def mark_unconfirmed(self, worker: WorkerKey) -> int:
        self._check()
        return await self.inner.mark_unconfirmed(worker)

    async def drop_unconfirmed(self, worker: WorkerKey) -> int:
        self._check()
        return await self.inner.drop_unconfirmed(worker)

    async def clear_worker(self, worker: WorkerKey) -> None:
        self._check()
        await self.inner.clear_worker(worker)

    async def remove_worker(self, worker: WorkerKey) -> None:
        self._check()
        await self.inner.remove_worker(worker)

    async def get_session(self, session_id: str) -> SessionView | None:
        self._check()
        return await self.inner.get_session(session_id)

    async def session_blocks(
        self,
        session_id: str,
        *,
        pod: str | None,
        medium: str | None,
        limit: int,
        cursor: str | None,
    ) -> Page[Hash] | None:
        self._check()
        return await self.inner.session_blocks(
            session_id, pod=pod, medium=medium, limit=limit, cursor=cursor
        )

    async def list_sessions(
        self,
        *,
        pod: str | None,
        limit: int,
        cursor: str | None,
        order: SessionOrder = "last_seen",
        prefix: str | None = None,
    ) -> Page[SessionSummary]:
        self._check()
        return await self.inner.list_sessions(
            pod=pod, limit=limit, cursor=cursor, order=order, prefix=prefix
        )

    async def list_workers(self) -> list[WorkerView]:
        self._check()
        return await self.inner.list_workers()

    async def worker_blocks(
        self, pod: str, *, dp_rank: int | None, medium: str | None, limit: int, cursor: str | None
    ) -> Page[Hash] | None:
        self._check()
        return await self.inner.worker_blocks(
            pod, dp_rank=dp_rank, medium=medium, limit=limit, cursor=cursor
        )

    async def expire_sessions(self, older_than: float, limit: int) -> Expired:
        self._check()
        return await self.inner.expire_sessions(older_than, limit)

    async def close(self) -> None:
        await self.inner.close()
