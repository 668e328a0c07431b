"""Payload bytes -> events, for every vLLM release's encoding, never raising.

Imports msgspec, the wire types and the store model only. Two targets share one procedure:
the full wire model (`kvsi tail`, fixtures) and the store's events (ingest), which skip
the fields the index does not use (token ids are most of a payload). The whole batch is
decoded in one typed call; only a batch that fails is re-read event by event, so one bad
event costs only itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

import msgspec

from kvsi.hashing.dynamo import tokens_hashes
from kvsi.store.model import (
    EntriesRemoved,
    EntriesStored,
    Hash,
    StoreEvent,
    WorkerCleared,
    canonical_hash,
)
from kvsi.subscriber import wire
from kvsi.subscriber.drops import DropReason

E = TypeVar("E")

_EVENT_TAGS = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})

_UNREADABLE = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
"""What reading bad bytes raises: msgspec's errors (ValidationError is a DecodeError), a str
that is not UTF-8 (the generic decoder's error), and nesting deeper than msgspec recurses."""


class _IngestStored(EntriesStored, frozen=True, tag="BlockStored", tag_field="type"):
    """BlockStored read straight into the store's event, unused fields skipped (the parent
    hash and block size are read: they place and size what eviction takes from a session)."""


class _IngestRemoved(EntriesRemoved, frozen=True, tag="BlockRemoved", tag_field="type"):
    """BlockRemoved read straight into the store's event."""


class _IngestCleared(WorkerCleared, frozen=True, tag="AllBlocksCleared", tag_field="type"):
    """AllBlocksCleared read straight into the store's event."""


_IngestEvent = _IngestStored | _IngestRemoved | _IngestCleared


class _IngestBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_IngestEvent]
    data_parallel_rank: int | None = None


class _TokensStored(msgspec.Struct, frozen=True, tag="BlockStored", tag_field="type", gc=False):
    """BlockStored with what Dynamo's block hash needs (the Dynamo API is on): the token ids
    and the LoRA name, turned into `EntriesStored.tokens_hashes` by `entries`."""

    block_hashes: list[Hash]
    medium: str | None = None
    group_idx: int | None = None
    session_id: str | None = None
    parent_block_hash: Hash | None = None
    block_size: int | None = None
    token_ids: list[int] = []
    lora_name: str | None = None

    def entries(self) -> EntriesStored:
        return EntriesStored(
            self.block_hashes,
            self.medium,
            self.group_idx,
            self.session_id,
            self.parent_block_hash,
            self.block_size,
            _tokens_hashes(self.token_ids, self.block_size, self.lora_name, self.block_hashes),
        )


_TokensEvent = _TokensStored | _IngestRemoved | _IngestCleared


class _TokensBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_TokensEvent]
    data_parallel_rank: int | None = None


def _tokens_hashes(
    token_ids: list[int], block_size: int | None, lora_name: str | None, blocks: list[Hash]
) -> list[int] | None:
    """Dynamo's hash of each block's tokens, as its ZMQ listener computes it from a store:
    the event's block size, its LoRA name, no salt (the wire has none); blocks past the
    event's token ids get none. None if there are no tokens or they are not u32."""
    if not token_ids or not block_size:
        return None
    try:
        return tokens_hashes(token_ids, block_size, lora_name)[: len(blocks)]
    except ValueError:
        return None


@dataclass(slots=True)
class Decoded(Generic[E]):
    """One payload's outcome: its events (ok False if the batch was unreadable) and drops."""

    ts: float = 0.0
    data_parallel_rank: int | None = None
    events: list[E] = field(default_factory=list)
    dropped: list[DropReason] = field(default_factory=list)
    ok: bool = True


class BatchDecoder(Generic[E]):
    """Reads map-encoded (0.24.0 on) and positional (0.9.0-0.23.0) batches into events E.

    Remembers which encoding the stream used last, so a legacy stream does not pay for a
    failed map decode on every batch.
    """

    def __init__(
        self,
        map_batch: type[Any],
        map_event: Any,
        from_array: Callable[[wire.ArrayKVCacheEvent], E],
    ) -> None:
        self._map = msgspec.msgpack.Decoder(map_batch)
        self._map_event = msgspec.msgpack.Decoder(map_event)
        self._array = msgspec.msgpack.Decoder(wire.ArrayKVEventBatch)
        self._array_event = msgspec.msgpack.Decoder(wire.ArrayKVCacheEvent)
        self._raw = msgspec.msgpack.Decoder(wire.RawKVEventBatch)
        self._from_array = from_array
        self._prefer_array = False

    def decode(self, payload: bytes) -> Decoded[E]:
        """Decode one payload; never raises.

        Beyond msgspec's own errors, msgpack nested a few thousand levels deep (RecursionError)
        and strings that are not UTF-8 are valid-looking input msgspec refuses by raising;
        one such payload must not stop a stream.
        """
        try:
            return self._whole(payload)
        except _UNREADABLE:
            pass
        try:
            return self._event_by_event(payload)
        except _UNREADABLE:
            return Decoded(dropped=[DropReason.MALFORMED_BATCH], ok=False)

    def _whole(self, payload: bytes) -> Decoded[E]:
        if self._prefer_array:
            try:
                return self._from_array_batch(self._array.decode(payload))
            except msgspec.ValidationError:
                batch = self._map.decode(payload)
                self._prefer_array = False
                return Decoded(batch.ts, batch.data_parallel_rank, batch.events)
        try:
            batch = self._map.decode(payload)
            return Decoded(batch.ts, batch.data_parallel_rank, batch.events)
        except msgspec.ValidationError:
            decoded = self._from_array_batch(self._array.decode(payload))
            self._prefer_array = True
            return decoded

    def _from_array_batch(self, batch: wire.ArrayKVEventBatch) -> Decoded[E]:
        events = [self._from_array(e) for e in batch.events]
        return Decoded(batch.ts, batch.data_parallel_rank, events)

    def _event_by_event(self, payload: bytes) -> Decoded[E]:
        try:
            raw = self._raw.decode(payload)
        except msgspec.ValidationError:
            return Decoded(dropped=[DropReason.MALFORMED_BATCH], ok=False)
        except msgspec.DecodeError:
            return Decoded(dropped=[DropReason.NOT_MSGPACK], ok=False)
        out: Decoded[E] = Decoded(raw.ts, raw.data_parallel_rank)
        for item in raw.events:
            event = self._one_event(bytes(item))
            if isinstance(event, DropReason):
                out.dropped.append(event)
            else:
                out.events.append(event)
        return out

    def _one_event(self, item: bytes) -> E | DropReason:
        try:
            event: E = self._map_event.decode(item)
            return event
        except _UNREADABLE:
            pass
        try:
            return self._from_array(self._array_event.decode(item))
        except _UNREADABLE:
            return _classify(item)


def _classify(item: bytes) -> DropReason:
    """Tell an event of a kind we do not know from a broken one of a kind we do."""
    try:
        generic = msgspec.msgpack.decode(item)
    except _UNREADABLE:
        # Raw kept the bytes of one msgpack object, yet some (a bad timestamp extension,
        # deep nesting, a string that is not UTF-8) fail a generic decode: no tag to read.
        return DropReason.MALFORMED_EVENT
    tag: object = None
    if isinstance(generic, dict):
        tag = generic.get("type")
    elif isinstance(generic, list) and generic:
        tag = generic[0]
    if isinstance(tag, str) and tag not in _EVENT_TAGS:
        return DropReason.UNKNOWN_EVENT
    return DropReason.MALFORMED_EVENT


def _store_event(event: wire.ArrayKVCacheEvent, *, tokens: bool = False) -> StoreEvent:
    """Positional events: the only ones that can carry signed hashes (before 0.10.2).
    `tokens`: with Dynamo's hashes of the blocks' tokens (`_tokens_hashes`)."""
    if isinstance(event, wire.ArrayBlockStored):
        hashes = [canonical_hash(h) for h in event.block_hashes]
        parent = event.parent_block_hash
        return EntriesStored(
            hashes,
            event.medium,
            event.group_idx,
            parent_block_hash=None if parent is None else canonical_hash(parent),
            block_size=event.block_size,
            tokens_hashes=_tokens_hashes(
                event.token_ids, event.block_size, event.lora_name, event.block_hashes
            )
            if tokens
            else None,
        )
    if isinstance(event, wire.ArrayBlockRemoved):
        hashes = [canonical_hash(h) for h in event.block_hashes]
        return EntriesRemoved(hashes, event.medium, event.group_idx)
    return WorkerCleared()


def ingest_decoder(*, tokens: bool = False) -> BatchDecoder[StoreEvent]:
    """Decoder for the hot path: payload -> the store's events, nothing else materialized.

    `tokens` (the Dynamo API is on): stores also carry Dynamo's hashes of their blocks'
    tokens; the token ids are read and hashed, which the default decoder never does.
    """
    if not tokens:
        return BatchDecoder(_IngestBatch, _IngestEvent, _store_event)
    return _TokensDecoder()


class _TokensDecoder(BatchDecoder[StoreEvent]):
    """The ingest decoder with Dynamo's tokens hashes: `_TokensStored` -> `EntriesStored`."""

    def __init__(self) -> None:
        super().__init__(_TokensBatch, _TokensEvent, partial(_store_event, tokens=True))

    def decode(self, payload: bytes) -> Decoded[StoreEvent]:
        out = super().decode(payload)
        out.events = [e.entries() if isinstance(e, _TokensStored) else e for e in out.events]
        return out


def wire_decoder() -> BatchDecoder[wire.KVCacheEvent]:
    """Decoder to the one typed wire model (vLLM 0.33's types), for tools and tests."""
    return BatchDecoder(wire.KVEventBatch, wire.KVCacheEvent, wire.modernize)
