"""The API's read-only door to the index store, and how store failures become HTTP errors.

Imports neither zmq nor subscriber/. Routes get an IndexReader, never the store itself, so
no route can write the index (DESIGN: the API never writes) and no route forgets to turn a
store outage into a 503.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from typing import TypeVar, cast

from fastapi import HTTPException, Request

from store.base import IndexStore
from store.feed import FeedHub
from store.model import (
    DynamoInstance,
    Hash,
    InvalidCursorError,
    Page,
    SessionSummary,
    SessionView,
    WorkerKey,
    WorkerState,
    WorkerView,
)
from store.paging import SessionOrder

log = logging.getLogger(__name__)

T = TypeVar("T")


class OutageLog:
    """Store failures as one line each, at most one line per `every` seconds: an outage under
    load writes a few lines that say how many calls failed, not one traceback per request."""

    def __init__(self, every: float = 5.0) -> None:
        self._every = every
        self._next = 0.0
        self._held = 0

    def failed(self, method: str, exc: Exception) -> None:
        now = time.monotonic()
        if now < self._next:
            self._held += 1
            return
        log.error(
            "index store call failed: %s: %s (%s; %d more failed calls since the last line)",
            type(exc).__name__,
            exc,
            method,
            self._held,
            extra={"store_method": method, "error": type(exc).__name__},
        )
        self._next = now + self._every
        self._held = 0


class IndexReader:
    """The store's read methods: a bad cursor -> 400, any other failure -> 503, logged.

    A Redis outage surfaces here as ConnectionError or TimeoutError; callers (routers) should
    see "try later" (503), not a 500 that reads like a bug in this service.
    """

    def __init__(self, store: IndexStore) -> None:
        self._store = store
        self._outage = OutageLog()

    async def _call(self, method: str, pending: Awaitable[T]) -> T:
        try:
            return await pending
        except InvalidCursorError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from exc
        except Exception as exc:
            self._outage.failed(method, exc)
            raise HTTPException(
                status_code=503,
                detail=f"index store unavailable: {type(exc).__name__}: {exc}",
            ) from exc

    async def get_session(self, session_id: str) -> SessionView | None:
        return await self._call("get_session", self._store.get_session(session_id))

    async def session_blocks(
        self,
        session_id: str,
        *,
        pod: str | None,
        medium: str | None,
        limit: int,
        cursor: str | None,
    ) -> Page[Hash] | None:
        return await self._call(
            "session_blocks",
            self._store.session_blocks(
                session_id, pod=pod, medium=medium, limit=limit, cursor=cursor
            ),
        )

    async def list_sessions(
        self,
        *,
        pod: str | None,
        limit: int,
        cursor: str | None,
        order: SessionOrder,
        prefix: str | None,
    ) -> Page[SessionSummary]:
        return await self._call(
            "list_sessions",
            self._store.list_sessions(
                pod=pod, limit=limit, cursor=cursor, order=order, prefix=prefix
            ),
        )

    async def list_workers(self) -> list[WorkerView]:
        return await self._call("list_workers", self._store.list_workers())

    async def worker_states(self) -> dict[WorkerKey, WorkerState]:
        return await self._call("worker_states", self._store.worker_states())

    async def worker_blocks(
        self, pod: str, *, dp_rank: int | None, medium: str | None, limit: int, cursor: str | None
    ) -> Page[Hash] | None:
        return await self._call(
            "worker_blocks",
            self._store.worker_blocks(
                pod, dp_rank=dp_rank, medium=medium, limit=limit, cursor=cursor
            ),
        )

    async def match_prefix(
        self, hashes: list[Hash], workers: list[WorkerKey] | None
    ) -> dict[WorkerKey, list[tuple[str, ...]]]:
        return await self._call("match_prefix", self._store.match_prefix(hashes, workers))

    async def worker_models(self) -> dict[WorkerKey, str | None]:
        return await self._call("worker_models", self._store.worker_models())

    async def instances(self) -> list[DynamoInstance]:
        return await self._call("instances", self._store.instances())

    async def change_feed(self) -> FeedHub:
        return await self._call("change_feed", self._store.change_feed())


async def get_reader(request: Request) -> IndexReader:
    """FastAPI dependency: the reader create_app put on app.state (overridable in tests).

    Async: FastAPI runs a plain `def` dependency in its thread pool, a thread hand-off per
    request that cost more than the rest of the dependency work.
    """
    return cast(IndexReader, request.app.state.reader)
