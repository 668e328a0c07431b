"""Sessions: where a session's working memory lives, its block hashes, the session list.

Imports neither zmq nor subscriber/; reads the store through api.reader only.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response

from kvsi.api.params import SessionBlocksQuery, SessionId, SessionListQuery, once_each
from kvsi.api.reader import Reader, get_reader
from kvsi.api.schemas import (
    BlockPage,
    ErrorResponse,
    SessionList,
    SessionResponse,
    SessionSummary,
    json_response,
)
from kvsi.store.hashtext import format_hash
from kvsi.store.model import Frontier, WorkerKey

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "A bad parameter or cursor."},
    503: {"model": ErrorResponse, "description": "The index store is unavailable."},
}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorResponse, "description": "Session never seen, or aged out."}
}


def _not_found(session_id: str) -> HTTPException:
    return HTTPException(
        status_code=404, detail=f"session {session_id!r} not found (never seen, or aged out)"
    )


def _frontier(frontier: Frontier | None) -> dict[str, Any] | None:
    if frontier is None:
        return None
    return {"block_hash": format_hash(frontier.block_hash), "position": frontier.position}


@router.get("", responses=_ERRORS, dependencies=[Depends(once_each)])
async def list_sessions(reader: Reader, query: Annotated[SessionListQuery, Query()]) -> SessionList:
    """Sessions, most recently seen first (`order=last_seen`) or with the most resident
    blocks first (`order=blocks`); with `pod`, only those resident on that pod; with
    `prefix`, only ids starting with it.

    A session whose blocks were all evicted stays listed (with 0 blocks) until it ages out,
    unless `pod` or `order=blocks` is given. `order=blocks` reads every residency of the
    workers asked, per page: ask it for a first page of the busiest, not to walk the fleet.
    A cursor continues only the order it came from (another order's is a 400).
    """
    page = await reader.list_sessions(
        pod=query.pod,
        limit=query.limit,
        cursor=query.cursor,
        order=query.order,
        prefix=query.prefix,
    )
    return SessionList(
        sessions=[
            SessionSummary(
                session_id=s.session_id, blocks=s.blocks, pods=s.workers, last_seen=s.last_seen
            )
            for s in page.items
        ],
        next_cursor=page.next_cursor,
    )


@router.get("/{session_id}", responses=_ERRORS | _NOT_FOUND, response_model=SessionResponse)
async def get_session(session_id: SessionId, request: Request) -> Response:
    """Where the session's blocks are resident now, worker by worker, most blocks first.

    Each worker carries its stream `state`: counts from a worker that is not `live` (a gap
    that replay could not repair, a disconnect) may be stale, and a router should say so
    rather than trust them. Each also says what eviction took there since the session last
    stored there (`lost_blocks`, `reprefill_tokens`; a worker that lost all of it is still
    listed, with 0 blocks) and its `frontier`, the block it stored last.
    """
    reader = await get_reader(request)  # not injected: FastAPI solves a dependency per request
    view = await reader.get_session(session_id)
    if view is None:
        raise _not_found(session_id)
    # After the 404 check, so unknown sessions cost one store call.
    states = await reader.worker_states()
    return json_response(
        {
            "session_id": view.session_id,
            "total_blocks": view.total_blocks,
            "last_seen": view.last_seen,
            "pods": [
                {
                    "pod": w.pod,
                    "dp_rank": w.dp_rank,
                    "blocks": w.blocks,
                    "by_medium": w.by_medium,
                    "last_seen": w.last_seen,
                    "state": states.get(WorkerKey(w.pod, w.dp_rank)),
                    "lost_blocks": w.lost_blocks,
                    "reprefill_tokens": w.reprefill_tokens,
                    "frontier": _frontier(w.frontier),
                }
                for w in view.workers
            ],
        }
    )


@router.get(
    "/{session_id}/blocks", responses=_ERRORS | _NOT_FOUND, dependencies=[Depends(once_each)]
)
async def session_blocks(
    session_id: SessionId, reader: Reader, query: Annotated[SessionBlocksQuery, Query()]
) -> BlockPage:
    """Distinct block hashes resident for the session, in hash order, one page at a time.

    Integer hashes sort numerically before byte digests. A cursor stays valid while the
    index changes: the next page starts after the last hash returned.
    """
    page = await reader.session_blocks(
        session_id, pod=query.pod, medium=query.medium, limit=query.limit, cursor=query.cursor
    )
    if page is None:
        raise _not_found(session_id)
    return BlockPage(
        block_hashes=[format_hash(h) for h in page.items], next_cursor=page.next_cursor
    )
