"""A store wrapper for ingest tests: records every apply, and fails every call while down.

Imports the store only. It stands for any backend that can be unavailable (Redis stopped):
the memory store itself never fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from kvsi.store.memory import MemoryStore
from kvsi.store.model import ApplyOutcome, Batch, Fence, WorkerKey, WorkerStatus


class StoreDownError(ConnectionError):
    """What the wrapper raises while down, as redis-py raises ConnectionError."""


class RecordingStore:
    """IndexStore over a MemoryStore; `applied` lists (worker, seq, outcome) per apply and
    `statuses` every status set. While `down`, every call but `close` fails (any method:
    those not recording anything pass through `__getattr__`)."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.applied: list[tuple[WorkerKey, int, ApplyOutcome]] = []
        self.statuses: list[tuple[WorkerKey, WorkerStatus]] = []
        self.runs: list[list[int]] = []
        """The seqs of each store call (`apply`: one; `apply_many`: its run)."""
        self.delay = 0.0
        """Seconds each batch's apply takes (a slow store)."""
        self.down = False
        self.refused = 0
        """Calls refused while down."""
        self.fails_with: Exception | None = None
        """Raised by every call while set (a programming error, say), counted as refused."""
        self.poisoned: dict[int, Exception] = {}
        """Seqs whose apply always raises the given error (a batch the store cannot take),
        before anything of it is applied; counted as refused."""

    def _check(self) -> None:
        if self.down:
            self.refused += 1
            raise StoreDownError("index store is down (test)")
        if self.fails_with is not None:
            self.refused += 1
            raise self.fails_with

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        call = getattr(self.inner, method)

        async def checked(*args: Any, **kwargs: Any) -> Any:
            self._check()
            return await call(*args, **kwargs)

        return checked

    @property
    def applies_inline(self) -> bool:
        """The memory store's: a `delay` suspends, but turns only order the applies."""
        return self.inner.applies_inline

    def seqs(self, worker: WorkerKey) -> list[int]:
        """Seqs of the batches the worker's applies carried, in call order."""
        return [seq for w, seq, _ in self.applied if w == worker]

    async def apply(
        self, worker: WorkerKey, batch: Batch, expect: Fence | None = None
    ) -> ApplyOutcome:
        self.runs.append([batch.seq])
        return await self._apply(worker, batch, expect)

    async def apply_many(
        self, worker: WorkerKey, batches: Sequence[Batch], expect: Fence | None = None
    ) -> list[ApplyOutcome]:
        self.runs.append([batch.seq for batch in batches])
        return [await self._apply(worker, batch, expect) for batch in batches]

    async def _apply(
        self, worker: WorkerKey, batch: Batch, expect: Fence | None = None
    ) -> ApplyOutcome:
        self._check()
        if batch.seq in self.poisoned:
            self.refused += 1
            raise self.poisoned[batch.seq]
        if self.delay:
            await asyncio.sleep(self.delay)
        outcome = await self.inner.apply(worker, batch, expect)
        self.applied.append((worker, batch.seq, outcome))
        return outcome

    async def set_status(
        self, worker: WorkerKey, status: WorkerStatus, epoch: int | None = None
    ) -> bool:
        self._check()
        self.statuses.append((worker, status))
        return await self.inner.set_status(worker, status, epoch)

    async def close(self) -> None:
        await self.inner.close()
