"""Bad payloads are counted by reason and skip the smallest unit possible."""

from __future__ import annotations

import msgspec

from kvsi.store.model import EntriesRemoved, EntriesStored
from kvsi.subscriber.decode import ingest_decoder, wire_decoder
from kvsi.subscriber.drops import DropReason

GOOD_STORED = {
    "type": "BlockStored",
    "block_hashes": [1, 2**64 - 1],
    "parent_block_hash": None,
    "token_ids": [1] * 32,
    "block_size": 16,
    "lora_id": None,
    "medium": "GPU",
    "lora_name": None,
    "session_id": "s",
}
GOOD_REMOVED = {"type": "BlockRemoved", "block_hashes": [7], "medium": "GPU"}


def _payload(*events: object, rank: int | None = 0) -> bytes:
    return msgspec.msgpack.encode([1.5, list(events), rank])


def test_unknown_event_tag_is_skipped_and_the_rest_kept() -> None:
    payload = _payload(GOOD_STORED, {"type": "BlockMoved", "x": 1}, GOOD_REMOVED)
    for decoder in (ingest_decoder(), wire_decoder()):
        decoded = decoder.decode(payload)
        assert decoded.ok
        assert decoded.dropped == [DropReason.UNKNOWN_EVENT]
        assert len(decoded.events) == 2
        assert "Stored" in type(decoded.events[0]).__name__
        assert "Removed" in type(decoded.events[1]).__name__


def test_malformed_event_is_skipped_and_the_rest_kept() -> None:
    broken = dict(GOOD_STORED, block_hashes="not a list")
    decoded = ingest_decoder().decode(_payload(broken, GOOD_REMOVED, GOOD_STORED))
    assert decoded.dropped == [DropReason.MALFORMED_EVENT]
    assert isinstance(decoded.events[0], EntriesRemoved)
    assert isinstance(decoded.events[1], EntriesStored)


def test_unknown_fields_are_ignored() -> None:
    decoded = ingest_decoder().decode(_payload(dict(GOOD_STORED, future_field=[1, 2])))
    assert decoded.dropped == []
    assert isinstance(decoded.events[0], EntriesStored)
    assert decoded.events[0].session_id == "s"


def test_garbage_is_counted_not_raised() -> None:
    decoded = ingest_decoder().decode(b"\xc1\xc1\xc1")
    assert not decoded.ok and decoded.dropped == [DropReason.NOT_MSGPACK]
    decoded = ingest_decoder().decode(msgspec.msgpack.encode({"not": "a batch"}))
    assert not decoded.ok and decoded.dropped == [DropReason.MALFORMED_BATCH]
    truncated = _payload(GOOD_STORED)[:-5]
    decoded = ingest_decoder().decode(truncated)
    assert not decoded.ok and decoded.dropped == [DropReason.NOT_MSGPACK]


def test_hash_of_the_wrong_type_is_a_malformed_event() -> None:
    wrong = dict(GOOD_STORED, block_hashes=[1.5, "x"])
    decoded = ingest_decoder().decode(_payload(wrong, GOOD_REMOVED))
    assert decoded.dropped == [DropReason.MALFORMED_EVENT]
    assert len(decoded.events) == 1


def test_legacy_and_map_streams_alternate_without_loss() -> None:
    legacy = msgspec.msgpack.encode([2.0, [["BlockRemoved", [5]]], 0])
    modern = _payload(GOOD_REMOVED)
    decoder = ingest_decoder()
    for payload in (legacy, modern, legacy, legacy, modern):
        decoded = decoder.decode(payload)
        assert decoded.ok and decoded.dropped == []
        assert isinstance(decoded.events[0], EntriesRemoved)
