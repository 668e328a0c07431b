"""`GET /v1/sessions/{session_id}/hint`: the header that sends a session's next request to
the pod holding most of its KV cache, ready for llm-d's endpoint picker.

Imports neither zmq nor subscriber/; reads the store through api.reader, picks with
api.routers.llm_d.hints. docs/routers/llm-d.md says how a gateway uses it.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from pydantic import Field

from kvsi.api.candidates import connected, serving
from kvsi.api.params import QueryParams, SessionId, once_each
from kvsi.api.reader import Reader
from kvsi.api.routers.llm_d.hints import (
    HintFormat,
    HintOptions,
    SessionHint,
    best_for_session,
    hint_for,
)
from kvsi.api.schemas import ErrorResponse, json_response
from kvsi.store.model import WorkerKey

router = APIRouter(prefix="/v1/sessions", tags=["routing"])


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "A bad parameter."},
    404: {"model": ErrorResponse, "description": "Session never seen, or aged out."},
    503: {"model": ErrorResponse, "description": "The index store is unavailable."},
}


class HintQuery(QueryParams):
    """Which router's form the hint takes."""

    format: HintFormat = Field(
        "llm-d",
        description="`llm-d`: `x-session-token` for its session-affinity scorer or filter; "
        "`label`: the pod's name for a header-label-affinity-scorer.",
    )
    model: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Consider only workers serving this model (named by their topic "
        "`kv@<pod>@<model>` or configured); workers whose model is unknown are left out.",
    )


async def get_hint_options(request: Request) -> HintOptions:
    """The naming `create_app` was given (settings `llm_d`)."""
    options: HintOptions = request.app.state.hint_options
    return options


Options = Annotated[HintOptions, Depends(get_hint_options)]


@router.get(
    "/{session_id}/hint",
    responses=_ERRORS,
    dependencies=[Depends(once_each)],
    response_model=SessionHint,
)
async def session_hint(
    session_id: SessionId, reader: Reader, options: Options, query: Annotated[HintQuery, Query()]
) -> Response:
    """The hint for the session's next request: the worker holding most of the session
    (blocks weighted by medium, as `POST /v1/route` ranks a session without a prompt) among
    the workers that are not `disconnected` (and serve `model`, if given), as the header to
    set.

    200 with empty `headers` (and null `pod`) when none of them holds any block of the
    session: route the request as usual. 404 for a session never seen or aged out.
    """
    view = await reader.get_session(session_id)
    if view is None:
        raise HTTPException(
            status_code=404, detail=f"session {session_id!r} not found (never seen, or aged out)"
        )
    states = await reader.worker_states()
    candidates = connected(states)
    if query.model is not None:
        candidates = serving(candidates, await reader.worker_models(), query.model)
    by_session = {WorkerKey(w.pod, w.dp_rank): w.by_medium for w in view.workers}
    best = best_for_session(candidates, states, by_session, options.per_pod(query.format))
    hint = hint_for(query.format, options, best)
    return json_response(hint.model_dump() | {"session_id": session_id})
