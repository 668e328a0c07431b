"""The index store as ingest sees it: every call waits out a store outage, then lands.

Imports the store contract and metrics; never zmq or the API. Any exception from the store
counts as "unavailable" (a Redis outage surfaces as ConnectionError or TimeoutError): the
calling stream waits here, its inbox keeps buffering (bounded; an overflow becomes a gap
that replay repairs), /readyz says why, and the call is retried until the store answers.
IndexLostError is the exception: the store answered that it lost the worker's index, which
the stream repairs, so it goes straight back to the stream. A programming error
(`store.model.PROGRAMMING_ERRORS`) is retried alike, but logged once per distinct error as
`store.call_error` with its traceback, and /readyz says so: a stalled stream is not taken
for Redis trouble. An apply that raises the same programming error `UNAPPLIABLE_AFTER` times
in a row is given up (`UnappliableError`): a batch the store cannot take would otherwise
hold its worker's index still for good, over-reporting what the engine evicts since; the
stream loses that batch instead, as it loses one that cannot be read.
Retrying a write that may have landed is harmless: applies are fenced by seq, status and
flag writes are idempotent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import structlog

from kvsi.store.base import IndexStore
from kvsi.store.model import (
    PROGRAMMING_ERRORS,
    ApplyOutcome,
    Batch,
    Fence,
    IndexLostError,
    WorkerKey,
    WorkerStatus,
)
from kvsi.subscriber import metrics

log = structlog.get_logger(__name__)

T = TypeVar("T")

FIRST_RETRY_SECONDS = 0.05
"""First pause after a failed call; doubled per failure up to the gate's maximum."""

UNAPPLIABLE_AFTER = 5
"""Tries of an apply raising the same programming error before it is given up (the pauses
between them about 0.75 s in all): enough to outlast a race, far below what a publisher
buffers."""


class UnappliableError(Exception):
    """An apply raised the same programming error on every try; its `__cause__` is the last."""


class StoreGate:
    """One store shared by every stream of a process, with its availability."""

    def __init__(self, store: IndexStore, *, retry_max_seconds: float = 2.0) -> None:
        self.store = store
        self._retry_max = retry_max_seconds
        self.down_since: float | None = None
        """Wall-clock time of the first failure of the current outage; None while up."""
        self.recovered_at = 0.0
        """time.monotonic() of the end of the last outage: what arrived before it was buffered."""
        self._error = ""
        self._bug = ""
        """The last programming error logged, so that a retried one is logged once."""
        self.status_epoch: int | None = None
        """The roster epoch of this central replica's view (kvsi/discovery.py sets it),
        fencing every status it stores (`IndexWriter.set_status`); None: unfenced."""
        metrics.STORE_AVAILABLE.set(1)

    @property
    def available(self) -> bool:
        return self.down_since is None

    def reasons(self) -> list[str]:
        """Why ingest is not ready because of the store ([] while it answers)."""
        if self.down_since is None:
            return []
        what = "calls failing on a programming error" if self._bug else "unavailable"
        return [
            f"index store {what} for {time.time() - self.down_since:.1f}s "
            f"({self._error}); ingest is buffering and retrying"
        ]

    async def apply(
        self, worker: WorkerKey, batch: Batch, expect: Fence | None = None
    ) -> ApplyOutcome:
        """`IndexStore.apply`, retried until it lands (written out: it is the hot path)."""
        try:
            outcome = await self.store.apply(worker, batch, expect)
        except IndexLostError:
            raise
        except Exception as exc:  # any failure means unavailable; see the module docstring
            return await self._retry(
                "apply", exc, lambda: self.store.apply(worker, batch, expect), UNAPPLIABLE_AFTER
            )
        if self.down_since is not None:
            self._recovered()
        return outcome

    async def apply_many(
        self, worker: WorkerKey, batches: Sequence[Batch], expect: Fence | None = None
    ) -> list[ApplyOutcome]:
        """`IndexStore.apply_many`, retried until it lands (fenced: a retry is harmless)."""
        return await self._call(
            "apply", lambda: self.store.apply_many(worker, batches, expect), UNAPPLIABLE_AFTER
        )

    async def fence(self, worker: WorkerKey) -> Fence | None:
        return await self._call("fence", lambda: self.store.fence(worker))

    async def publish_status(self, current: Callable[[], tuple[WorkerKey, WorkerStatus]]) -> None:
        """Store `current()`, fenced by `status_epoch`; a retry stores what `current()` says
        then, so a status that waited out an outage lands as the latest one, not the one
        that failed. A status the fence refuses is dropped, counted and logged: the worker's
        owner has a newer view (the store keeps its status)."""

        async def write() -> tuple[WorkerKey, int | None, bool]:
            worker, status = current()
            epoch = self.status_epoch
            return worker, epoch, await self.store.set_status(worker, status, epoch)

        worker, epoch, stored = await self._call("set_status", write)
        if not stored:
            metrics.STATUSES_REFUSED.inc()
            log.info(
                "subscriber.status_refused",
                pod=worker.pod,
                dp_rank=worker.dp_rank,
                worker=str(worker),
                epoch=epoch,
            )

    async def mark_unconfirmed(self, worker: WorkerKey) -> int:
        return await self._call("mark_unconfirmed", lambda: self.store.mark_unconfirmed(worker))

    async def drop_unconfirmed(self, worker: WorkerKey) -> int:
        return await self._call("drop_unconfirmed", lambda: self.store.drop_unconfirmed(worker))

    async def clear_worker(self, worker: WorkerKey) -> None:
        await self._call("clear_worker", lambda: self.store.clear_worker(worker))

    async def remove_worker(self, worker: WorkerKey) -> None:
        await self._call("remove_worker", lambda: self.store.remove_worker(worker))

    async def release(self, worker: WorkerKey) -> None:
        await self._call("release", lambda: self.store.release(worker))

    async def _call(
        self, operation: str, call: Callable[[], Awaitable[T]], give_up: int | None = None
    ) -> T:
        try:
            result = await call()
        except IndexLostError:
            raise
        except Exception as exc:  # any failure means unavailable; see the module docstring
            return await self._retry(operation, exc, call, give_up)
        if self.down_since is not None:
            self._recovered()
        return result

    async def _retry(
        self,
        operation: str,
        exc: Exception,
        call: Callable[[], Awaitable[T]],
        give_up: int | None = None,
    ) -> T:
        """`call` again until it answers; raises UnappliableError once it raised the same
        programming error `give_up` times in a row (None: never)."""
        pause = FIRST_RETRY_SECONDS
        same = 0
        last = ""
        while True:
            self._failed(operation, exc)
            same = same + 1 if self._error == last else 1
            last = self._error
            if give_up is not None and same >= give_up and isinstance(exc, PROGRAMMING_ERRORS):
                # The gate stays as it is: the next call that lands says the store is back
                # (another stream may be waiting out a real outage meanwhile).
                raise UnappliableError(f"{same} tries: {self._error}") from exc
            await asyncio.sleep(pause)
            pause = min(pause * 2, self._retry_max)
            try:
                result = await call()
            except IndexLostError:
                self._recovered()
                raise
            except Exception as again:  # still unavailable
                exc = again
                continue
            self._recovered()
            return result

    def _failed(self, operation: str, exc: Exception) -> None:
        metrics.STORE_ERRORS.labels(operation).inc()
        self._error = f"{operation}: {type(exc).__name__}: {exc}"
        if not isinstance(exc, PROGRAMMING_ERRORS):
            self._bug = ""
        elif self._error != self._bug:
            self._bug = self._error
            log.error("store.call_error", operation=operation, error=self._error, exc_info=exc)
        if self.down_since is None:
            self.down_since = time.time()
            metrics.STORE_AVAILABLE.set(0)
            log.warning("store.unavailable", operation=operation, error=self._error)

    def _recovered(self) -> None:
        if self.down_since is None:
            return
        log.info("store.available", outage_seconds=round(time.time() - self.down_since, 3))
        self.down_since = None
        self._bug = ""
        self.recovered_at = time.monotonic()
        metrics.STORE_AVAILABLE.set(1)
