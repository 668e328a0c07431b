"""vLLM's KV-event wire types, mirroring `vllm/distributed/kv_events.py` of every release.

Imports msgspec only. The map-encoded types are vLLM 0.33's exactly (the simulator encodes
with them, byte for byte); the `Array*` types read the positional events of 0.9.0-0.23.0.
Fields are only ever appended upstream, so late fields carry defaults and unknown ones are
ignored.
"""

from __future__ import annotations

from typing import Any

import msgspec

ExternalBlockHash = bytes | int

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""Seq frame of the replay end marker (all 0xff)."""


class BlockStored(
    msgspec.Struct, tag="BlockStored", tag_field="type", omit_defaults=True, gc=False
):
    """Blocks stored (or, with `kv_cache_report_mode="full"`, re-reported) by a request."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None


class BlockRemoved(
    msgspec.Struct, tag="BlockRemoved", tag_field="type", omit_defaults=True, gc=False
):
    """Blocks evicted from one medium (and KV cache group)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(
    msgspec.Struct, tag="AllBlocksCleared", tag_field="type", omit_defaults=True, gc=False
):
    """Every block of the engine dropped (prefix cache reset)."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """`[ts, events, data_parallel_rank]` with map-encoded events (vLLM 0.24.0 on)."""

    ts: float
    events: list[KVCacheEvent]
    data_parallel_rank: int | None = None


class ArrayBlockStored(msgspec.Struct, tag="BlockStored", array_like=True, gc=False):
    """`["BlockStored", ...]` of 0.9.0-0.23.0; fields after `lora_id` arrived later."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class ArrayBlockRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True, gc=False):
    """`["BlockRemoved", ...]` of 0.9.0-0.23.0."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None = None
    group_idx: int | None = None


class ArrayAllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True, gc=False):
    """`["AllBlocksCleared"]` of 0.9.0-0.23.0."""


ArrayKVCacheEvent = ArrayBlockStored | ArrayBlockRemoved | ArrayAllBlocksCleared


class ArrayKVEventBatch(msgspec.Struct, array_like=True, gc=False):
    """`[ts, events]` (0.9.0) or `[ts, events, data_parallel_rank]` with positional events."""

    ts: float
    events: list[ArrayKVCacheEvent]
    data_parallel_rank: int | None = None


class RawKVEventBatch(msgspec.Struct, array_like=True, gc=False):
    """The batch with its events left undecoded, to isolate one bad event from the rest."""

    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


def modernize(event: ArrayKVCacheEvent) -> KVCacheEvent:
    """A positional event as the one typed model (0.33's map-encoded type)."""
    if isinstance(event, ArrayBlockStored):
        return BlockStored(
            block_hashes=event.block_hashes,
            parent_block_hash=event.parent_block_hash,
            token_ids=event.token_ids,
            block_size=event.block_size,
            lora_id=event.lora_id,
            medium=event.medium,
            lora_name=event.lora_name,
            extra_keys=event.extra_keys,
            group_idx=event.group_idx,
            kv_cache_spec_kind=event.kv_cache_spec_kind,
            kv_cache_spec_sliding_window=event.kv_cache_spec_sliding_window,
        )
    if isinstance(event, ArrayBlockRemoved):
        return BlockRemoved(
            block_hashes=event.block_hashes, medium=event.medium, group_idx=event.group_idx
        )
    return AllBlocksCleared()
