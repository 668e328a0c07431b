"""Pods: every worker's counts and stream health, and the block hashes a pod holds.

Imports neither zmq nor subscriber/; reads the store through api.reader only.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query

from kvsi.api.params import PodBlocksQuery, PodName, once_each
from kvsi.api.reader import Reader
from kvsi.api.schemas import BlockPage, ErrorResponse, PodList, PodWorker
from kvsi.store.hashtext import format_hash

router = APIRouter(prefix="/v1/pods", tags=["pods"])


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "A bad parameter or cursor."},
    503: {"model": ErrorResponse, "description": "The index store is unavailable."},
}


@router.get("", responses={503: _ERRORS[503]})
async def list_pods(reader: Reader) -> PodList:
    """Every known worker (pod, data-parallel rank), ordered by pod then rank.

    `state` says how far the counts can be trusted: only `live` is exact.
    """
    return PodList(
        pods=[
            PodWorker(
                pod=w.pod,
                dp_rank=w.dp_rank,
                blocks=w.blocks,
                sessions=w.sessions,
                last_seq=w.last_seq,
                state=w.status.state,
                state_since=w.status.since,
                state_detail=w.status.detail,
                batches_lost=w.status.batches_lost,
                gaps=w.status.gaps,
                replays=w.status.replays,
                restarts=w.status.restarts,
                lag_batches=w.status.lag_batches,
                lag_seconds=w.status.lag_seconds,
                last_event_at=w.last_event_at,
                model=w.model,
            )
            for w in await reader.list_workers()
        ]
    )


@router.get(
    "/{pod}/blocks",
    responses=_ERRORS
    | {404: {"model": ErrorResponse, "description": "No worker of that pod (and rank)."}},
    dependencies=[Depends(once_each)],
)
async def pod_blocks(
    pod: PodName, reader: Reader, query: Annotated[PodBlocksQuery, Query()]
) -> BlockPage:
    """Distinct block hashes the pod holds (all ranks unless `dp_rank`), in hash order."""
    page = await reader.worker_blocks(
        pod, dp_rank=query.dp_rank, medium=query.medium, limit=query.limit, cursor=query.cursor
    )
    if page is None:
        which = f"pod {pod!r}" if query.dp_rank is None else f"pod {pod!r} dp_rank {query.dp_rank}"
        raise HTTPException(status_code=404, detail=f"{which} is not known to the index")
    return BlockPage(
        block_hashes=[format_hash(h) for h in page.items], next_cursor=page.next_cursor
    )
