"""Request and response bodies of the Dynamo standalone KV indexer API, as Dynamo shapes them.

Imports neither zmq nor subscriber/. Field names, defaults and nesting follow ai-dynamo/dynamo's
standalone indexer (`lib/kv-router/src/standalone_indexer/server.rs` and its documentation
page); recorded examples in tests/fixtures/dynamo/. Unknown fields are ignored, as serde
ignores them upstream (`tenant_id` and `additional_salt` are named: documented, unused).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, Strict, field_validator

from kvsi.api.params import POD_PATTERN
from kvsi.store.endpoints import zmq_endpoint

DEFAULT_ROUTING_GROUP = "default"

MAX_HASHES = 65_536
"""A 1M-token prompt at block size 16, the most Dynamo's 8 MB body limit lets through."""
MAX_TOKENS = 1_048_576
MAX_NAME = 256
MAX_ENDPOINT = 1_024
MAX_INSTANCE_ID = 2**64 - 1
MAX_DP_RANK = 2**32 - 1
"""Dynamo's dp_rank is a u32."""


SignedHash = Annotated[int, Strict(), Field(ge=-(2**63), le=2**64 - 1)]
"""A block hash as Dynamo takes it, a signed 64-bit int; its unsigned form is accepted too."""
TokenId = Annotated[int, Strict(), Field(ge=0, lt=2**32)]
InstanceId = Annotated[int, Strict(), Field(ge=0, le=MAX_INSTANCE_ID)]
DpRank = Annotated[int, Strict(), Field(ge=0, le=MAX_DP_RANK)]
ModelName = Annotated[str, Field(max_length=MAX_NAME)]
RoutingGroup = Annotated[str, Field(max_length=MAX_NAME)]
"""Any string, the empty one too, as Dynamo takes them."""

_IGNORED = "Accepted for compatibility and ignored, as Dynamo does."


class _Body(BaseModel):
    """A request body: a field Dynamo does not define is ignored, as Dynamo's serde does."""

    model_config = ConfigDict(extra="ignore")

    tenant_id: str | None = Field(default=None, max_length=MAX_NAME, description=_IGNORED)


def _zmq_endpoint(value: str | None) -> str | None:
    return None if value is None else zmq_endpoint(value)


class QueryByHashRequest(_Body):
    """`POST /query_by_hash`: a prompt's blocks by Dynamo's local block hashes."""

    block_hashes: list[SignedHash] = Field(
        max_length=MAX_HASHES,
        description="Dynamo's local hash of each block's tokens (`compute_block_hash_for_seq`), "
        "first block first, as signed 64-bit ints (the unsigned value is accepted too).",
    )
    model_name: ModelName
    routing_group: RoutingGroup = DEFAULT_ROUTING_GROUP
    cache_salt: str | None = Field(
        default=None,
        description="Must be omitted or null: precomputed hashes already carry their salt.",
    )

    @field_validator("cache_salt")
    @classmethod
    def _no_salt(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError(
                "is not accepted by /query_by_hash: block_hashes must already include the "
                "intended cache salt (use /query to have token ids hashed with one)"
            )
        return value


class QueryRequest(_Body):
    """`POST /query`: a prompt's token ids, hashed here as Dynamo hashes them."""

    token_ids: list[TokenId] = Field(max_length=MAX_TOKENS)
    model_name: ModelName
    routing_group: RoutingGroup = DEFAULT_ROUTING_GROUP
    lora_name: str | None = Field(
        default=None,
        max_length=MAX_NAME,
        description="LoRA adapter name, mixed into the blocks' hashes as Dynamo mixes it.",
    )
    cache_salt: str | None = Field(
        default=None,
        max_length=MAX_ENDPOINT,
        description="The request's cache salt, mixed into the blocks' hashes as Dynamo does.",
    )


class RegisterRequest(_Body):
    """`POST /register`: one data-parallel rank of a worker instance."""

    instance_id: InstanceId
    endpoint: str = Field(
        min_length=1, max_length=MAX_ENDPOINT, description="The engine's ZMQ PUB address."
    )
    model_name: ModelName
    block_size: int = Field(strict=True, ge=1, le=4096)
    routing_group: RoutingGroup = DEFAULT_ROUTING_GROUP
    dp_rank: DpRank | None = None
    replay_endpoint: str | None = Field(
        default=None, min_length=1, max_length=MAX_ENDPOINT, description="ZMQ ROUTER address."
    )
    additional_salt: str | None = Field(
        default=None,
        max_length=MAX_ENDPOINT,
        validation_alias=AliasChoices("additional_salt", "additionalsalt"),
        description=_IGNORED,
    )
    pod: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=POD_PATTERN,
        description="kvsi only: the pod kvsi already subscribes to for this rank (the "
        "registration then only names it). Omitted: kvsi subscribes to `endpoint` as pod "
        "`dynamo-<instance_id>`.",
    )

    _endpoints = field_validator("endpoint", "replay_endpoint")(_zmq_endpoint)


class UnregisterRequest(_Body):
    """`POST /unregister`: one rank of an instance, or all of them."""

    instance_id: InstanceId
    model_name: ModelName
    routing_group: RoutingGroup | None = None
    dp_rank: DpRank | None = None


class WorkersQuery(BaseModel):
    """`GET /workers` filters, each independent; other parameters are ignored, as Dynamo
    ignores them."""

    model_config = ConfigDict(extra="ignore")

    model_name: str | None = Field(default=None, min_length=1, max_length=MAX_NAME)
    routing_group: str | None = Field(default=None, min_length=1, max_length=MAX_NAME)
    tenant_id: str | None = Field(default=None, max_length=MAX_NAME, description=_IGNORED)


class InstanceOverlap(BaseModel):
    """One instance's matched prefix per tier, in tokens (Mooncake RFC #1403's shape)."""

    longest_matched: int = Field(description="max(gpu, cpu, disk).")
    gpu: int = Field(description="The longest device-tier prefix over the instance's ranks.")
    dp: dict[str, int] = Field(description="Device-tier prefix per dp_rank.")
    cpu: int = Field(description="Through the host tier, cumulative over gpu.")
    disk: int = Field(description="Through the disk and external tiers, cumulative over cpu.")


class ScoreResponse(BaseModel):
    """`/query` and `/query_by_hash`: matched tokens per instance and rank."""

    scores: dict[str, dict[str, int]] = Field(
        description="instance_id -> dp_rank -> device-tier matched tokens, every registered rank."
    )
    frequencies: list[int] = Field(description="Always empty: access counts are not kept.")
    instances: dict[str, InstanceOverlap]


ListenerStatus = Literal["pending", "active", "paused", "failed"]


class Listener(BaseModel):
    endpoint: str
    status: ListenerStatus
    last_error: str | None = None


class WorkerInfo(BaseModel):
    """A registered instance, as `GET /workers` lists it."""

    instance_id: int
    source: Literal["zmq"]
    status: ListenerStatus = Field(description="Over listeners: failed > pending > active.")
    model_name: str
    routing_group: str
    block_size: int
    endpoints: dict[str, str] = Field(description="dp_rank -> ZMQ address.")
    listeners: dict[str, Listener]
    kvsi_workers: dict[str, str] = Field(
        description="kvsi only: dp_rank -> the kvsi worker (`pod/rank`) answering for it."
    )


class StoredBlock(BaseModel):
    block_hash: int = Field(description="The engine's block hash.")
    tokens_hash: int = Field(description="Dynamo's hash of the block's tokens.")
    mm_extra_info: None = None


class StoredData(BaseModel):
    parent_hash: int | None = Field(description="The block before it; null: a prompt's start.")
    start_position: None = None
    blocks: list[StoredBlock]


class StoredEvent(BaseModel):
    stored: StoredData


class CacheEvent(BaseModel):
    event_id: int
    data: StoredEvent
    dp_rank: int


class RouterEvent(BaseModel):
    worker_id: int
    storage_tier: Literal["device", "host_pinned", "disk"]
    event: CacheEvent


class DumpEntry(BaseModel):
    """One (model, routing group): its block size and its workers' blocks as stored events."""

    block_size: int
    events: list[RouterEvent]
    truncated: bool = Field(description="kvsi only: the dump limit cut this entry short.")


class Status(BaseModel):
    status: Literal["ok"] = "ok"


class DynamoError(BaseModel):
    """Every error of this API, as Dynamo's: one sentence under `error`."""

    error: str
