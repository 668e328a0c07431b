"""`POST /v1/route`: rank candidate workers for a session's next request and its prompt.

Imports neither zmq nor subscriber/; reads the store through api.reader, hashes token ids
with `hashing` exactly as vLLM 0.33 does, and scores with `api.ranking`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, HTTPException, Request, Response
from pydantic import BaseModel, Field, Strict, field_validator, model_validator

from kvsi import hashing
from kvsi.api.candidates import connected, named, serving
from kvsi.api.params import MEDIUM_PATTERN, POD_PATTERN, SESSION_ID_PATTERN, BodyModel
from kvsi.api.ranking import Evidence, Weights, rank
from kvsi.api.reader import get_reader
from kvsi.api.routers.dynamo.headers import routing_headers
from kvsi.api.routers.llm_d.hints import Hint, HintFormat, HintOptions, route_hint
from kvsi.api.schemas import ErrorResponse, json_response
from kvsi.store.hashtext import parse_hash
from kvsi.store.model import Hash, SessionView, WorkerKey, WorkerState

router = APIRouter(prefix="/v1", tags=["routing"])

MAX_PROMPT_BLOCKS = 16_384
"""A 256k-token prompt at block size 16: longer lists are a client bug, not a prompt."""
MAX_TOKENS = 262_144
MAX_CANDIDATES = 1_024

SCORE_DOC = """\
Ranks candidate workers (pods and data-parallel ranks) for a session's next request.

Give `session_id`, the prompt (`block_hashes`, or `token_ids` with the engine's `hashing`
parameters), or both. Candidates default to every worker that is not `disconnected`; with
`model`, only those serving it (workers whose model is unknown are left out).

**Score.** weight(m) is the request's per-medium weight (defaults GPU 1.0, CPU 0.8, any other
medium 0.5).
- *prefix score*: over the longest run of the prompt's blocks, from the first, that the
  worker holds (`prefix_blocks`), the sum of the best weight among the media holding each;
- *session score*: sum over media of weight(m) x the session's blocks there;
- `score` is the prefix score when the prompt is given (the reusable prefix is what saves
  prefill), else the session score.

Order: `score`, then the session score, then `live` before other states, then pod and
dp_rank; the best `limit` (default 10) are returned. A worker whose `state` is not `live`
is ranked on what the index holds; its state says the numbers are not exact.
"""


Medium = Annotated[str, Field(pattern=MEDIUM_PATTERN)]
Weight = Annotated[float, Strict(), Field(ge=0, le=1000)]
TokenId = Annotated[int, Strict(), Field(ge=0, lt=2**32)]
"""Strict numbers: `true` or `"5"` is a client bug, not token 1 or 5."""
_POD = re.compile(POD_PATTERN)


class Hashing(BodyModel):
    """How the engine hashes prompts (must match its vLLM configuration)."""

    block_size: int = Field(
        default=16, strict=True, ge=1, le=4096, description="The engine's hash block size."
    )
    algorithm: Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"] = Field(
        default="sha256", description="--prefix-caching-hash-algo."
    )
    hash_seed: str | None = Field(
        default=None, max_length=64, description="The engine's PYTHONHASHSEED, if it sets one."
    )
    lora_name: str | None = Field(default=None, max_length=256)
    lora_path: str | None = Field(
        default=None, max_length=1024, description="Needed with lora_name."
    )
    cache_salt: str | None = Field(default=None, max_length=1024)


class RouteRequest(BodyModel):
    """What a router knows about the next request."""

    session_id: str | None = Field(
        default=None, min_length=1, max_length=256, pattern=SESSION_ID_PATTERN
    )
    block_hashes: list[str] | None = Field(
        default=None,
        max_length=MAX_PROMPT_BLOCKS,
        description="The prompt's block hashes as the engine publishes them (decimal or 0x-hex).",
    )
    token_ids: list[TokenId] | None = Field(
        default=None,
        max_length=MAX_TOKENS,
        description="The prompt's token ids, hashed like vLLM 0.33.",
    )
    hashing: Hashing = Field(default_factory=lambda: Hashing())
    candidates: list[str] | None = Field(
        default=None,
        max_length=MAX_CANDIDATES,
        description='Pods ("vllm-0") or workers ("vllm-0/1") to rank; default every '
        "worker that is not disconnected.",
    )
    limit: int = Field(
        default=10,
        strict=True,
        ge=1,
        le=MAX_CANDIDATES,
        description="Return the best `limit` workers.",
    )
    weights: dict[Medium, Weight] | None = Field(
        default=None,
        max_length=16,
        description='Per-medium weights, e.g. {"GPU": 1.0, "CPU": 0.8}.',
    )
    model: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Rank only workers serving this model (named by their topic "
        "`kv@<pod>@<model>` or configured); workers whose model is unknown are left out.",
    )
    hint: HintFormat | None = Field(
        default=None,
        description="Also answer `hint`: the header that sends the request to the first "
        "worker (`llm-d`: llm-d's x-session-token; `label`: the pod's name).",
    )

    @field_validator("block_hashes")
    @classmethod
    def _hashes(cls, value: list[str] | None) -> list[str] | None:
        for text in value or []:
            parse_hash(text)
        return value

    @field_validator("candidates")
    @classmethod
    def _candidates(cls, value: list[str] | None) -> list[str] | None:
        for item in value or []:
            pod, _, rank_text = item.partition("/")
            if not _is_pod(pod) or (rank_text and not rank_text.isdigit()):
                raise ValueError(f"candidate {item!r} is not POD or POD/RANK")
        return value

    @model_validator(mode="after")
    def _something_to_rank_by(self) -> RouteRequest:
        if self.block_hashes is not None and self.token_ids is not None:
            raise ValueError("give block_hashes or token_ids, not both")
        if self.session_id is None and self.block_hashes is None and self.token_ids is None:
            raise ValueError("give session_id, block_hashes or token_ids (or several)")
        return self


def _is_pod(text: str) -> bool:
    return len(text) <= 253 and _POD.fullmatch(text) is not None


class RankedWorker(BaseModel):
    pod: str
    dp_rank: int
    score: float = Field(description="See the formula above.")
    session_blocks: int = Field(description="The session's blocks on this worker.")
    prefix_blocks: int = Field(description="Prompt blocks held, as a run from the first.")
    by_medium: dict[str, int] = Field(description="`session_blocks` split by medium.")
    state: WorkerState = Field(description="Only `live` means the numbers are exact.")
    dynamo_headers: dict[str, str] | None = Field(
        default=None,
        description="Headers that make Dynamo's frontend send the request straight to this "
        "worker (`x-worker-instance-id`, `x-dp-rank`), when it is registered with a Dynamo "
        "instance id (`POST /register` of the Dynamo API); null otherwise.",
    )


class RouteResponse(BaseModel):
    ranking: list[RankedWorker] = Field(description="Best first.")
    prompt_blocks: int = Field(description="Full blocks in the prompt (hashes ranked against).")
    block_hashes: list[str] | None = Field(
        None, description="The hashes computed from `token_ids`, when given."
    )
    hint: Hint | None = Field(
        None,
        description="With `hint` asked: the first worker as the header to set "
        "(docs/routers/llm-d.md); null when not asked, or no worker holds any of the "
        "session or the prompt.",
    )


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "A bad body: the detail says what."},
    503: {"model": ErrorResponse, "description": "The index store is unavailable."},
}


@router.post("/route", responses=_ERRORS, description=SCORE_DOC, response_model=RouteResponse)
async def route(body: RouteRequest, request: Request) -> Response:
    """Rank workers for the next request of a session."""
    # Taken from the app here, not injected: FastAPI solves a dependency per request and runs
    # a plain `def` one (the hint options') in its thread pool, a thread hand-off each.
    reader = await get_reader(request)
    hint_options: HintOptions = request.app.state.hint_options
    hashes, computed = _prompt_hashes(body)
    states = await reader.worker_states()
    if body.candidates is None:
        keys = connected(states)
        among: list[WorkerKey] | None = None  # every worker: ranking keeps the connected
    else:
        keys = named(body.candidates, states)
        among = keys.ordered
    if body.model is not None:
        keys = serving(keys, await reader.worker_models(), body.model)
        among = keys.ordered
    session_id = body.session_id

    def read_prefix() -> Awaitable[dict[WorkerKey, list[tuple[str, ...]]]]:
        return reader.match_prefix(hashes, among) if hashes else _nothing({})

    def read_session() -> Awaitable[SessionView | None]:
        return reader.get_session(session_id) if session_id is not None else _nothing(None)

    if request.app.state.overlap_reads:  # both at once: their round trips overlap
        prefix, view = await asyncio.gather(read_prefix(), read_session())
    else:  # in-process reads: gather's two tasks and loop turns would cost more than they do
        prefix = await read_prefix()
        view = await read_session()
    by_session: dict[WorkerKey, dict[str, int]] = {
        WorkerKey(w.pod, w.dp_rank): w.by_medium for w in (view.workers if view else [])
    }
    ranked = rank(
        keys,
        Evidence(states, by_session, prefix),
        Weights(body.weights),
        by_prompt=hashes is not None,
        limit=body.limit,
    )
    headers = routing_headers(await reader.instances())
    return json_response(
        {
            "ranking": [
                {
                    "pod": r.worker.pod,
                    "dp_rank": r.worker.dp_rank,
                    "score": r.score,
                    "session_blocks": r.session_blocks,
                    "prefix_blocks": r.prefix_blocks,
                    "by_medium": r.by_medium,
                    "state": r.state,
                    "dynamo_headers": headers.get(r.worker),
                }
                for r in ranked
            ],
            "prompt_blocks": len(hashes or []),
            "block_hashes": computed,
            "hint": route_hint(body.hint, hint_options, ranked),
        }
    )


T = TypeVar("T")


async def _nothing(value: T) -> T:
    """An awaitable of `value`, for a store read a request does not need."""
    return value


def _prompt_hashes(body: RouteRequest) -> tuple[list[Hash] | None, list[str] | None]:
    if body.block_hashes is not None:
        return [parse_hash(h) for h in body.block_hashes], None
    if body.token_ids is None:
        return None, None
    h = body.hashing
    try:
        hashes = hashing.block_hashes(
            body.token_ids,
            block_size=h.block_size,
            algorithm=h.algorithm,
            hash_seed=h.hash_seed,
            lora_name=h.lora_name,
            lora_path=h.lora_path,
            cache_salt=h.cache_salt,
        )
    except (ValueError, ModuleNotFoundError) as exc:
        raise HTTPException(status_code=400, detail=f"hashing: {exc}") from exc
    return list(hashes), [str(x) for x in hashes]
