"""The ingest decoder with Dynamo's tokens hashes (the Dynamo API on): on every release's
payloads, the same events as the default decoder, each store with Dynamo's hash of its
blocks' tokens (its block size, its LoRA name), none past the tokens it carries."""

from __future__ import annotations

import msgspec
import pytest

from kvsi.hashing.dynamo import tokens_hashes
from kvsi.store.model import EntriesStored
from kvsi.subscriber import wire
from kvsi.subscriber.decode import ingest_decoder, wire_decoder
from tests.paths import WIRE
from tests.wire.test_fixtures import _cases


@pytest.mark.parametrize(("release", "case"), _cases())
def test_stores_carry_dynamos_hashes_of_their_tokens(release: str, case: dict[str, object]) -> None:
    payload = (WIRE / release / str(case["file"])).read_bytes()
    plain = ingest_decoder().decode(payload)
    tokens = ingest_decoder(tokens=True).decode(payload)
    full = wire_decoder().decode(payload)

    assert (tokens.ok, tokens.ts, tokens.dropped) == (plain.ok, plain.ts, plain.dropped)
    assert len(tokens.events) == len(plain.events) == len(full.events)
    for got, off, event in zip(tokens.events, plain.events, full.events, strict=True):
        if not isinstance(event, wire.BlockStored):
            assert got == off
            continue
        assert isinstance(got, EntriesStored)
        expected = None
        if event.token_ids and event.block_size:
            hashes = tokens_hashes(event.token_ids, event.block_size, event.lora_name)
            expected = hashes[: len(event.block_hashes)]
        assert got.tokens_hashes == expected
        unhashed = msgspec.structs.replace(got, tokens_hashes=None)
        assert msgspec.structs.asdict(unhashed) == msgspec.structs.asdict(off)


def test_a_store_short_of_tokens_hashes_only_its_full_blocks() -> None:
    stored = wire.BlockStored(
        block_hashes=[1, 2, 3],
        parent_block_hash=None,
        token_ids=list(range(9)),
        block_size=4,
        lora_id=None,
        medium="GPU",
        lora_name="sql",
    )
    payload = msgspec.msgpack.encode(wire.KVEventBatch(ts=1.0, events=[stored]))

    [got] = ingest_decoder(tokens=True).decode(payload).events

    assert isinstance(got, EntriesStored)
    assert got.tokens_hashes == tokens_hashes(list(range(8)), 4, "sql")
    assert len(got.tokens_hashes) == 2


def test_the_default_decoder_never_takes_tokens_hashes_from_the_wire() -> None:
    forged = {
        "type": "BlockStored",
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": [1, 2, 3, 4],
        "block_size": 4,
        "lora_id": None,
        "medium": None,
        "lora_name": None,
        "tokens_hashes": [7],
    }
    payload = msgspec.msgpack.encode([1.0, [forged], 0])

    [got] = ingest_decoder().decode(payload).events

    assert isinstance(got, EntriesStored)
    assert got.tokens_hashes is None


def test_token_ids_beyond_u32_give_no_hashes_and_keep_the_store() -> None:
    stored = wire.BlockStored(
        block_hashes=[1],
        parent_block_hash=None,
        token_ids=[2**32, 1, 2, 3],
        block_size=4,
        lora_id=None,
        medium=None,
        lora_name=None,
    )
    payload = msgspec.msgpack.encode(wire.KVEventBatch(ts=1.0, events=[stored]))

    [got] = ingest_decoder(tokens=True).decode(payload).events

    assert isinstance(got, EntriesStored)
    assert (got.block_hashes, got.tokens_hashes) == ([1], None)
