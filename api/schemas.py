"""JSON bodies of every response: the contract routers and dashboards code against.

Imports neither zmq nor subscriber/. Block hashes are always strings (`store.hashtext.format_hash`):
vLLM's u64 hashes exceed 2^53, where JavaScript numbers lose precision. Timestamps are Unix
seconds as floats; `last_seen` is the engine's clock (the batch timestamp), the others this
service's clock.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field
from pydantic_core import to_json
from starlette.responses import Response

from kvsi.store.model import WorkerState


def json_response(content: object) -> Response:
    """A 200 answer of `content` (plain dicts and lists) as JSON.

    For the per-request hot paths: building the body as pydantic models cost more than the
    store's read. pydantic's own encoder writes it, so the bytes are those the route's
    `response_model` (which still documents the shape) would give; tests hold both to it.
    """
    return Response(to_json(content), media_type="application/json")


class ErrorResponse(BaseModel):
    """Every error, whatever its status: one human-readable sentence saying what is wrong."""

    detail: str = Field(examples=["session 'sess-A' not found (never seen, or aged out)"])


class SessionFrontier(BaseModel):
    """The block a session most recently stored on a worker, and where it sits in the prompt."""

    block_hash: str = Field(description="As every block hash: decimal, or `0x` + hex.")
    position: int | None = Field(
        description="Its index in the prompt, in blocks from 0, when the events tell: a store "
        "from the prompt's start, or continuing the session's previous one here. null if not."
    )


class SessionPod(BaseModel):
    """A session's residency on one worker (pod, data-parallel rank)."""

    pod: str
    dp_rank: int
    blocks: int = Field(description="Distinct entries of the session resident on this worker.")
    by_medium: dict[str, int] = Field(
        description='`blocks` split by medium, e.g. {"GPU": 12, "CPU": 3}.'
    )
    last_seen: float = Field(
        description="Engine timestamp (Unix seconds) of the session's last store here."
    )
    state: WorkerState | None = Field(
        description="The worker's stream state; only `live` means the counts are exact. "
        "null if the worker was removed while the request ran."
    )
    lost_blocks: int = Field(
        description="Entries of the session eviction took from this worker since the session "
        "last stored here (a BlockRemoved, or the worker's cache emptied: AllBlocksCleared, "
        "an engine restart); a store here resets it. Entries the index dropped for want of "
        "events (a degraded worker's stale entries) are not counted."
    )
    reprefill_tokens: int | None = Field(
        description="`lost_blocks` x the block size of the session's last store here: the "
        "prompt tokens a next turn here prefills again. null if the block size is unknown."
    )
    frontier: SessionFrontier | None = Field(
        description="The block the session most recently stored here (it may have been "
        "evicted since); null before any."
    )


class SessionResponse(BaseModel):
    """Where a session's working memory lives now, most blocks first."""

    session_id: str
    total_blocks: int = Field(description="Sum of `blocks` over `pods`.")
    last_seen: float = Field(description="Engine timestamp (Unix seconds) of the last store.")
    pods: list[SessionPod] = Field(
        description="One item per worker holding at least one block of the session, or "
        "that lost some (`lost_blocks`) since the session last stored there."
    )


class BlockPage(BaseModel):
    """One page of distinct block hashes, in the store's hash order."""

    block_hashes: list[str] = Field(
        description="Decimal for integer hashes, `0x` + lowercase hex for byte digests.",
        examples=[["18446744073709551557", "0x00ff"]],
    )
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null at end.")


class SessionSummary(BaseModel):
    """A line of the session list."""

    session_id: str
    blocks: int = Field(description="Resident blocks (on the filtered pod if `pod` was given).")
    pods: int = Field(description="Number of workers (pod, dp_rank) holding any of its blocks.")
    last_seen: float = Field(description="Engine timestamp (Unix seconds) of the last store.")


class SessionList(BaseModel):
    """One page of sessions, most recently seen first."""

    sessions: list[SessionSummary]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null at end.")


class PodWorker(BaseModel):
    """One worker (pod, data-parallel rank): its counts and how far they can be trusted."""

    pod: str
    dp_rank: int
    blocks: int = Field(description="Entries resident on the worker, every medium and group.")
    sessions: int = Field(description="Sessions with at least one block on the worker.")
    last_seq: int | None = Field(description="Seq of the last applied batch; null before one.")
    state: WorkerState = Field(description="Only `live` means the worker's index is exact.")
    state_since: float = Field(description="When the worker entered `state` (Unix seconds).")
    state_detail: str = Field(description="Why the worker is in `state`, if not live.")
    batches_lost: int = Field(description="Batches missed and not repaired by replay.")
    gaps: int = Field(
        default=0,
        description="Seq gaps the worker's stream met (repaired or not) since it started.",
    )
    replays: int = Field(default=0, description="Replays its stream asked the publisher for.")
    restarts: int = Field(default=0, description="Engine restarts its stream detected.")
    lag_batches: int = Field(
        default=0, description="Batches received and not applied yet, as last stored."
    )
    lag_seconds: float = Field(
        default=0.0, description="Age of the oldest batch not applied yet, as last stored."
    )
    last_event_at: float | None = Field(
        description="When this service last applied a batch of the worker (Unix seconds)."
    )
    model: str | None = Field(
        default=None,
        description="The model the worker serves (its topic `kv@<pod>@<model>`, or "
        "configured); null if unknown.",
    )


class PodList(BaseModel):
    """Every known worker, ordered by pod then rank."""

    pods: list[PodWorker]


class Health(BaseModel):
    """Liveness: the process serves HTTP."""

    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    """Readiness: `ready`, or `not ready` with the reasons (a 503)."""

    status: Literal["ready", "not ready"]
    reasons: list[str] | None = Field(
        default=None, description="Present only when not ready: what is missing."
    )
