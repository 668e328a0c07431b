"""The API's doors to the index store, and how store failures become HTTP errors.

Imports neither zmq nor subscriber/. Routes get an `IndexReader` (store/base.py's read
role), never the store itself, so no route can write the index (DESIGN: the API never
writes) and no route forgets to turn a store outage into a 503: every call goes through
`Guarded`, whatever the role's methods are.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, cast

import structlog
from fastapi import Depends, HTTPException, Request

from kvsi.store.base import IndexReader
from kvsi.store.model import PROGRAMMING_ERRORS, InvalidCursorError

log = structlog.get_logger(__name__)


class OutageLog:
    """Store failures as one line each, at most one line per `every` seconds: an outage under
    load writes a few lines that say how many calls failed, not one traceback per request (a
    programming error's line carries its traceback: `store.model.PROGRAMMING_ERRORS`)."""

    def __init__(self, every: float = 5.0) -> None:
        self._every = every
        self._next = 0.0
        self._held = 0

    def failed(self, method: str, exc: Exception) -> None:
        now = time.monotonic()
        if now < self._next:
            self._held += 1
            return
        bug = {"exc_info": exc} if isinstance(exc, PROGRAMMING_ERRORS) else {}
        log.error(
            "store.call_failed",
            error=f"{type(exc).__name__}: {exc}",
            store_method=method,
            failed_since_last_line=self._held,
            **bug,
        )
        self._next = now + self._every
        self._held = 0


class Guarded:
    """A store role whose every call maps failures to HTTP errors: a bad cursor -> 400, any
    other failure -> 503, logged by an `OutageLog`.

    A Redis outage surfaces as ConnectionError or TimeoutError; callers (routers) should see
    "try later" (503), not a 500 that reads like a bug in this service. Wraps any role (a
    decorator, as llm-d wraps an index with metrics), so no method is copied here by hand.
    """

    def __init__(self, store: object) -> None:
        self._store = store
        self._outage = OutageLog()

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        call = getattr(self._store, method)

        async def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return await call(*args, **kwargs)
            except InvalidCursorError as exc:
                raise HTTPException(status_code=400, detail=str(exc)) from exc
            except Exception as exc:
                self._outage.failed(method, exc)
                raise HTTPException(
                    status_code=503,
                    detail=f"index store unavailable: {type(exc).__name__}: {exc}",
                ) from exc

        setattr(self, method, guarded)  # later lookups skip __getattr__
        return guarded


def guarded_reader(store: IndexReader) -> IndexReader:
    """The read role of `store`, behind a `Guarded` door."""
    return cast(IndexReader, Guarded(store))


async def get_reader(request: Request) -> IndexReader:
    """FastAPI dependency: the reader create_app put on app.state (overridable in tests).

    Async: FastAPI runs a plain `def` dependency in its thread pool, a thread hand-off per
    request that cost more than the rest of the dependency work.
    """
    return cast(IndexReader, request.app.state.reader)


Reader = Annotated[IndexReader, Depends(get_reader)]
"""A route parameter: the app's store as a guarded reader (`get_reader`)."""
