"""Every payload of every vLLM release (0.9.0-0.33.0) decodes to its documented meaning."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from kvsi.store.hashtext import format_hash, parse_hash
from kvsi.store.model import EntriesRemoved, EntriesStored, WorkerCleared
from kvsi.subscriber import wire
from kvsi.subscriber.decode import ingest_decoder, wire_decoder
from tests.paths import WIRE

INDEX = {entry["release"]: entry for entry in json.loads((WIRE / "index.json").read_text())}


def _release_cases(release: str) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads((WIRE / release / "cases.json").read_text())["cases"]
    return cases


def _cases() -> list[Any]:
    out = []
    for release in sorted(INDEX):
        for case in _release_cases(release):
            out.append(pytest.param(release, case, id=f"{release}/{case['scenario']}"))
    return out


def _normal(value: Any, key: str) -> Any:
    if key == "block_hashes":
        return [format_hash(h) for h in value]
    if key == "parent_block_hash":
        return None if value is None else format_hash(value)
    if key == "extra_keys" and value is not None:
        return [None if k is None else list(k) for k in value]
    return value


def normalize(batch_ts: float, rank: int | None, events: list[wire.KVCacheEvent], release: str):
    """The decoded batch in cases.json's normalized JSON form, with the release's fields."""
    fields = INDEX[release]["fields"]
    out_events = []
    for event in events:
        tag = type(event).__name__
        item: dict[str, Any] = {"type": tag}
        for name in fields[tag]:
            item[name] = _normal(getattr(event, name), name)
        out_events.append(item)
    return {"ts": batch_ts, "data_parallel_rank": rank, "events": out_events}


@pytest.mark.parametrize(("release", "case"), _cases())
def test_fixture_decodes_to_its_expected_meaning(release: str, case: dict[str, Any]) -> None:
    payload = (WIRE / release / case["file"]).read_bytes()
    decoded = wire_decoder().decode(payload)
    assert decoded.ok and decoded.dropped == []
    got = normalize(decoded.ts, decoded.data_parallel_rank, decoded.events, release)
    assert got == case["expected"]


@pytest.mark.parametrize(("release", "case"), _cases())
def test_ingest_decoder_keeps_what_the_index_needs(release: str, case: dict[str, Any]) -> None:
    payload = (WIRE / release / case["file"]).read_bytes()
    decoded = ingest_decoder().decode(payload)
    assert decoded.ok and decoded.dropped == []
    expected = case["expected"]["events"]
    assert len(decoded.events) == len(expected)
    for event, want in zip(decoded.events, expected, strict=True):
        if want["type"] == "AllBlocksCleared":
            assert isinstance(event, WorkerCleared)
            continue
        assert isinstance(event, EntriesStored if want["type"] == "BlockStored" else EntriesRemoved)
        canonical = [format_hash(parse_hash(h)) for h in want["block_hashes"]]
        assert [format_hash(h) for h in event.block_hashes] == canonical
        assert event.medium == want.get("medium")
        assert event.group_idx == want.get("group_idx")
        if isinstance(event, EntriesStored):
            assert event.session_id == want.get("session_id")
            assert event.block_size == want["block_size"]
            parent = want["parent_block_hash"]
            assert event.parent_block_hash == (None if parent is None else parse_hash(parent))


def test_every_release_and_file_is_covered() -> None:
    files = {
        f"{r}/{c['file']}"
        for r in INDEX
        for c in json.loads((WIRE / r / "cases.json").read_text())["cases"]
    }
    listed = {f for entry in INDEX.values() for f in entry["files"]}
    assert files == listed
    assert len(INDEX) == 18


def test_large_int_hashes_stay_exact_as_strings() -> None:
    decoded = wire_decoder().decode((WIRE / "0.33.0" / "stored_int_hashes.msgpack").read_bytes())
    stored = decoded.events[0]
    assert isinstance(stored, wire.BlockStored)
    assert 2**64 - 59 in stored.block_hashes
    assert format_hash(2**64 - 59) == "18446744073709551557"


def test_simulator_encoding_is_byte_identical_to_vllm_033() -> None:
    """Re-encoding the decoded 0.33 payloads with our 0.33 types gives vLLM's bytes back."""
    encoder = msgspec.msgpack.Encoder()
    for case in json.loads((WIRE / "0.33.0" / "cases.json").read_text())["cases"]:
        payload = (WIRE / "0.33.0" / case["file"]).read_bytes()
        batch = msgspec.msgpack.decode(payload, type=wire.KVEventBatch)
        assert encoder.encode(batch) == payload, case["file"]


def test_signed_hashes_of_old_releases_enter_the_index_unsigned() -> None:
    payload = (WIRE / "0.9.0" / "stored_signed_int_hashes.msgpack").read_bytes()
    event = ingest_decoder().decode(payload).events[0]
    assert isinstance(event, EntriesStored)
    assert event.block_hashes == [2**63, 2**64 - 1, 1234567890123456789]
    assert parse_hash("-1") == 2**64 - 1
