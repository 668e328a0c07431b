"""Dynamo's standalone KV indexer API over the index: overlap queries, registrations, dump.

Imports neither zmq nor subscriber/. Paths, bodies and answers follow ai-dynamo/dynamo's
`python -m dynamo.indexer`; docs/routers/dynamo.md says what differs. The app serving them
is api.routers.dynamo.app. Only registered instances (`POST /register`) appear: Dynamo's
answers are keyed by instance id, and a registration is what gives a worker one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response

from kvsi.api.routers.dynamo.registry import RegistryDoor, get_door
from kvsi.api.routers.dynamo.schemas import (
    DumpEntry,
    DynamoError,
    Listener,
    ListenerStatus,
    QueryByHashRequest,
    QueryRequest,
    RegisterRequest,
    ScoreResponse,
    Status,
    UnregisterRequest,
    WorkerInfo,
    WorkersQuery,
)
from kvsi.api.routers.dynamo.scores import overlap_answer
from kvsi.api.schemas import json_response
from kvsi.hashing.dynamo import tokens_hashes
from kvsi.store.model import U64_MASK, Hash, WorkerKey, WorkerState, WorkerView
from kvsi.store.registry import DynamoInstance
from kvsi.store.tokens import Edge

router = APIRouter(tags=["dynamo"])
probe_router = APIRouter(tags=["dynamo"])
"""`/health`: open even where bearer tokens guard the rest."""

Door = Annotated[RegistryDoor, Depends(get_door)]

DUMP_TIERS = (("GPU", "device"), ("CPU", "host_pinned"), ("DISK", "disk"))
"""The media `/dump` lists, and the storage tier Dynamo names each."""

DUMP_PAGE = 10_000
"""Blocks per read of a worker's medium while `/dump` gathers what it holds."""

LISTENER_OF: dict[WorkerState, ListenerStatus] = {
    WorkerState.CONNECTING: "pending",
    WorkerState.LIVE: "active",
    WorkerState.DEGRADED: "active",
    WorkerState.DISCONNECTED: "failed",
}
"""A worker's stream state as the listener status Dynamo reports."""

STATUS_ORDER: tuple[ListenerStatus, ...] = ("failed", "pending", "active", "paused")
"""Dynamo's aggregation over an instance's listeners: the first present wins."""


@dataclass(frozen=True)
class DynamoOptions:
    """How much `/dump` lists (kvsi.settings.DynamoConfig)."""

    dump_limit: int = 10_000


async def get_options(request: Request) -> DynamoOptions:
    return cast(DynamoOptions, request.app.state.dynamo_options)


Options = Annotated[DynamoOptions, Depends(get_options)]


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    described = {
        400: "A bad body or parameter: the error says what.",
        404: "Nothing registered for that model and routing group (or instance).",
        409: "The registration conflicts with one already there.",
        503: "The index store is unavailable.",
    }
    return {code: {"model": DynamoError, "description": described[code]} for code in codes}


@router.post("/query_by_hash", response_model=ScoreResponse, responses=_errors(400, 404, 503))
async def query_by_hash(body: QueryByHashRequest, door: Door) -> Response:
    """Matched tokens per instance and rank for a prompt's blocks given by Dynamo's local
    block hashes (`compute_block_hash_for_seq`: each block's tokens hashed), signed."""
    group = await _registered(door, body.model_name, body.routing_group)
    tokens = [h & U64_MASK for h in body.block_hashes]
    return json_response(await _overlap(door, group, tokens))


@router.post("/query", response_model=ScoreResponse, responses=_errors(400, 404, 503))
async def query(body: QueryRequest, door: Door) -> Response:
    """Matched tokens per instance and rank for a prompt's token ids, hashed as Dynamo hashes
    them (the group's block size, `lora_name`, `cache_salt`; a partial last block ignored)."""
    group = await _registered(door, body.model_name, body.routing_group)
    # Up to a million tokens: hashing takes a while, off the event loop.
    tokens = await asyncio.to_thread(
        tokens_hashes, body.token_ids, group[0].block_size, body.lora_name, body.cache_salt
    )
    return json_response(await _overlap(door, group, tokens))


async def _registered(door: RegistryDoor, model: str, group: str) -> list[DynamoInstance]:
    """The registrations of one (model, routing group); 404 as Dynamo's "no indexer"."""
    found = [
        i for i in await door.instances() if i.model_name == model and i.routing_group == group
    ]
    if not found:
        raise HTTPException(
            status_code=404, detail=f"no indexer for model={model} routing_group={group}"
        )
    return found


async def _overlap(
    door: RegistryDoor, group: list[DynamoInstance], tokens: list[int]
) -> dict[str, Any]:
    held = await door.match_tokens(tokens, [i.worker for i in group]) if tokens else {}
    return overlap_answer(group, held, group[0].block_size)


async def _each_filter_once(request: Request) -> None:
    """A filter given twice is a 400: keeping one of the values would answer another query."""
    names = [name for name, _ in request.query_params.multi_items()]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise HTTPException(
            status_code=400,
            detail=f"query parameter {', '.join(map(repr, repeated))} given more than once",
        )


@router.get(
    "/workers",
    responses=_errors(400, 503),
    response_model_exclude_none=True,
    dependencies=[Depends(_each_filter_once)],
)
async def workers(door: Door, query: Annotated[WorkersQuery, Query()]) -> list[WorkerInfo]:
    """Registered instances, one item per (instance, model, routing group), with the state
    of the stream behind each rank as Dynamo's listener status."""
    chosen = [
        i
        for i in await door.instances()
        if query.model_name in (None, i.model_name)
        and query.routing_group in (None, i.routing_group)
    ]
    views = {WorkerKey(w.pod, w.dp_rank): w for w in await door.list_workers()} if chosen else {}
    grouped: dict[tuple[int, str, str], list[DynamoInstance]] = {}
    for i in chosen:
        grouped.setdefault((i.instance_id, i.model_name, i.routing_group), []).append(i)
    return [_worker_info(ranks, views) for ranks in grouped.values()]


def _worker_info(ranks: list[DynamoInstance], views: Mapping[WorkerKey, WorkerView]) -> WorkerInfo:
    listeners = {str(i.dp_rank): _listener(i, views.get(i.worker)) for i in ranks}
    present = {listener.status for listener in listeners.values()}
    first = ranks[0]
    return WorkerInfo(
        instance_id=first.instance_id,
        source="zmq",
        status=next(s for s in STATUS_ORDER if s in present),
        model_name=first.model_name,
        routing_group=first.routing_group,
        block_size=first.block_size,
        endpoints={str(i.dp_rank): i.endpoint for i in ranks},
        listeners=listeners,
        kvsi_workers={str(i.dp_rank): str(i.worker) for i in ranks},
    )


def _listener(instance: DynamoInstance, view: WorkerView | None) -> Listener:
    if view is None:  # not subscribed yet, or its stream wrote nothing yet
        return Listener(endpoint=instance.endpoint, status="pending")
    state = view.status.state
    trouble = state in (WorkerState.DEGRADED, WorkerState.DISCONNECTED)
    return Listener(
        endpoint=instance.endpoint,
        status=LISTENER_OF[state],
        last_error=(view.status.detail or None) if trouble else None,
    )


@router.post("/register", status_code=201, responses=_errors(400, 409, 503))
async def register(body: RegisterRequest, door: Door) -> Status:
    """Register one rank of an instance: name the worker answering for it (`pod`), or have
    ingest subscribe to `endpoint` as pod `dynamo-<instance_id>`."""
    instance = DynamoInstance(
        instance_id=body.instance_id,
        dp_rank=body.dp_rank or 0,
        pod=body.pod or f"dynamo-{body.instance_id}",
        model_name=body.model_name,
        routing_group=body.routing_group,
        block_size=body.block_size,
        endpoint=body.endpoint,
        replay_endpoint=body.replay_endpoint,
        subscribe=body.pod is None,
    )
    clash = _clash(instance, await door.instances())
    if clash is None:
        taken = await door.register_instance(instance)
        clash = None if taken is None else _clash(instance, [taken])
    if clash is not None:
        raise HTTPException(status_code=409, detail=clash)
    return Status()


def _clash(new: DynamoInstance, existing: list[DynamoInstance]) -> str | None:
    """Why `new` cannot join `existing` (Dynamo's rules, plus one worker per rank)."""
    for old in existing:
        if (old.instance_id, old.dp_rank) == (new.instance_id, new.dp_rank):
            return (
                f"instance {new.instance_id} dp_rank {new.dp_rank} is already registered "
                f"(model {old.model_name!r}, endpoint {old.endpoint}); unregister it first"
            )
        if old.instance_id == new.instance_id and (old.model_name, old.routing_group) != (
            new.model_name,
            new.routing_group,
        ):
            return (
                f"instance {new.instance_id} is already registered for model="
                f"{old.model_name} routing_group={old.routing_group}"
            )
        if (old.model_name, old.routing_group) == (new.model_name, new.routing_group) and (
            old.block_size != new.block_size
        ):
            return (
                f"model {new.model_name!r} routing group {new.routing_group!r} has block size "
                f"{old.block_size}, not {new.block_size}"
            )
        if old.worker == new.worker:
            return f"worker {new.worker} already answers for instance {old.instance_id}"
    return None


@router.post("/unregister", responses=_errors(400, 404, 503))
async def unregister(body: UnregisterRequest, door: Door) -> Status:
    """Forget an instance's registration for a model (one routing group, or every one; one
    rank, or every one). Ingest then stops the streams it started for it and forgets
    their workers."""
    chosen = [
        i
        for i in await door.instances()
        if i.instance_id == body.instance_id
        and i.model_name == body.model_name
        and (
            body.routing_group is None  # every group and rank, as Dynamo ignores dp_rank then
            or (i.routing_group == body.routing_group and body.dp_rank in (None, i.dp_rank))
        )
    ]
    if not chosen:
        raise HTTPException(
            status_code=404,
            detail=f"instance {body.instance_id} is not registered for model "
            f"{body.model_name!r}" + ("" if body.dp_rank is None else f" dp_rank {body.dp_rank}"),
        )
    for i in chosen:
        await door.unregister_instance(i.instance_id, i.dp_rank)
    return Status()


@router.get("/dump", response_model=dict[str, DumpEntry], responses=_errors(503))
async def dump(door: Door, options: Options) -> Response:
    """Each (model, routing group)'s registered workers' blocks as Dynamo stored events: per
    tier (device, host, disk), one event per block with its parent and its tokens hash, a
    parent before its children, so a Dynamo indexer recovering from it (`--peers`) builds
    the same tree. At most `dynamo.dump_limit` blocks in all (`truncated`)."""
    budget = options.dump_limit
    out: dict[str, dict[str, Any]] = {}
    for i in await door.instances():
        key = f"{i.model_name}:{i.routing_group}"
        entry = out.setdefault(key, {"block_size": i.block_size, "events": [], "truncated": False})
        edges = await door.token_edges(i.worker)
        order = parent_order(edges)
        events: list[Any] = entry["events"]
        for medium, tier in DUMP_TIERS:
            if budget == 0:
                entry["truncated"] = entry["truncated"] or bool(order)
                break
            held = await _held(door, i, medium) if order else set()
            if held is None:
                break  # no such worker (yet)
            for h in order:
                if h not in held:
                    continue
                if budget == 0:
                    entry["truncated"] = True
                    break
                budget -= 1
                events.append(_stored(i, tier, h, edges[h], len(events)))
    return json_response(out)


async def _held(door: RegistryDoor, instance: DynamoInstance, medium: str) -> set[Hash] | None:
    """Every block the instance's worker holds on `medium` (None: no such worker)."""
    held: set[Hash] = set()
    cursor = None
    while True:
        page = await door.worker_blocks(
            instance.pod, dp_rank=instance.dp_rank, medium=medium, limit=DUMP_PAGE, cursor=cursor
        )
        if page is None:
            return None
        held.update(page.items)
        cursor = page.next_cursor
        if cursor is None:
            return held


def parent_order(edges: Mapping[int, Edge]) -> list[int]:
    """The blocks of `edges`, each after its parent (by depth from a prompt's start, a block
    whose parent has no edge counting as a start), then by hash."""
    depth: dict[int, int] = {}
    for h in edges:
        chain: dict[int, None] = {}
        cur: int | None = h
        while cur is not None and cur in edges and cur not in depth and cur not in chain:
            chain[cur] = None
            cur = edges[cur][0]
        base = depth.get(cur, -1) if cur is not None else -1
        for n, block in enumerate(reversed(chain), start=base + 1):
            depth[block] = n
    return sorted(edges, key=lambda h: (depth[h], h))


def _stored(instance: DynamoInstance, tier: str, block: int, edge: Edge, event_id: int) -> Any:
    """One Dynamo RouterEvent storing `block` under its parent, keyed by its tokens hash."""
    parent, tokens = edge
    stored = {
        "parent_hash": parent,
        "start_position": None,
        "blocks": [{"block_hash": block, "tokens_hash": tokens, "mm_extra_info": None}],
    }
    return {
        "worker_id": instance.instance_id,
        "storage_tier": tier,
        "event": {"event_id": event_id, "data": {"stored": stored}, "dp_rank": instance.dp_rank},
    }


@probe_router.get("/health", response_class=Response, responses={200: {"description": "Alive."}})
async def health() -> Response:
    """Liveness, as Dynamo's: 200 with an empty body, touching nothing."""
    return Response(status_code=200)
