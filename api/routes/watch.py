"""`GET /v1/watch`: the change feed as Server-Sent Events, for routers keeping a warm view.

Imports neither zmq nor subscriber/. Events: `residency` (a session's blocks on a worker
changed), `worker` (a worker's state changed), `reset` (the resume point is gone: re-read the
index), `overflow` (this client fell behind and is disconnected; ingest never waits for it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

import msgspec
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from kvsi.api.params import POD_PATTERN, SESSION_ID_PATTERN, QueryParams
from kvsi.api.reader import Reader
from kvsi.api.schemas import ErrorResponse
from kvsi.store.feed import FeedHub, HistoryGone, Overflow, Subscription

router = APIRouter(prefix="/v1", tags=["watch"])


KEEPALIVE_SECONDS = 15.0
"""A comment line this often keeps proxies from closing an idle stream."""

STOP_CHECK_SECONDS = 0.5
"""How often an idle stream looks whether the service is stopping (`api.app.stop_streams`):
a graceful shutdown waits for open streams, so they end on their own."""

MAX_FILTER = 1_000


SessionFilter = Annotated[str, Field(min_length=1, max_length=256, pattern=SESSION_ID_PATTERN)]
PodFilter = Annotated[str, Field(min_length=1, max_length=253, pattern=POD_PATTERN)]


class WatchQuery(QueryParams):
    """Filters: only these sessions, only these pods (each repeatable; none: everything)."""

    session: list[SessionFilter] = Field(
        default=[], max_length=MAX_FILTER, description="Session ids to watch (repeatable)."
    )
    pod: list[PodFilter] = Field(
        default=[], max_length=MAX_FILTER, description="Pods to watch (repeatable)."
    )


def sse(event: str, data: bytes, event_id: str | None = None) -> bytes:
    """One Server-Sent Event (data is one line of JSON)."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\n".encode() + b"data: " + data + b"\n\n"


@router.get(
    "/watch",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "An SSE stream."},
        400: {"model": ErrorResponse, "description": "A bad filter."},
        503: {"model": ErrorResponse, "description": "The index store is unavailable."},
    },
)
async def watch(
    request: Request,
    reader: Reader,
    query: Annotated[WatchQuery, Query()],
    last_event_id: Annotated[
        str | None, Header(max_length=128, description="Resume after this event id.")
    ] = None,
) -> StreamingResponse:
    """Stream residency and worker-state changes, in order, as Server-Sent Events.

    Each `residency` event: `{"session_id", "pod", "dp_rank", "added", "removed", "blocks",
    "ts", "lost"}` (`blocks` is the total now; `lost`, of `removed`, what eviction took);
    each `worker` event: `{"pod", "dp_rank", "state",
    "since", "detail"}`. Every event has an `id`; reconnect with `Last-Event-ID` to resume
    within the bounded history (the ids are the same on every API replica with Redis).
    """
    hub = await reader.change_feed()
    sessions = frozenset(query.session) or None
    pods = frozenset(query.pod) or None
    try:
        sub = hub.subscribe(after=last_event_id, sessions=sessions, pods=pods)
        reset: bytes | None = None
    except HistoryGone as exc:
        sub = hub.subscribe(after=None, sessions=sessions, pods=pods)
        reset = sse("reset", msgspec.json.encode({"detail": str(exc)}))
    return StreamingResponse(
        _events(request, hub, sub, reset),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _events(
    request: Request, hub: FeedHub, sub: Subscription, first: bytes | None
) -> AsyncIterator[bytes]:
    stopping: asyncio.Event = request.app.state.stopping
    idle = 0.0
    try:
        if first is not None:
            yield first
        yield b": watching\n\n"
        while not stopping.is_set():
            try:
                async with asyncio.timeout(STOP_CHECK_SECONDS):
                    entry = await sub.next()
            except TimeoutError:
                idle += STOP_CHECK_SECONDS
                if idle >= KEEPALIVE_SECONDS:
                    if await request.is_disconnected():
                        return
                    idle = 0.0
                    yield b": keepalive\n\n"
                continue
            except Overflow:
                detail = f"client fell more than {hub.queue_size} events behind; reconnect"
                yield sse("overflow", msgspec.json.encode({"detail": detail}))
                return
            idle = 0.0
            kind = "residency" if entry.change.__struct_config__.tag == "residency" else "worker"
            yield sse(kind, msgspec.json.encode(entry.change), entry.id)
    finally:
        hub.unsubscribe(sub)
