"""The live and replay framings captured from vLLM publishers decode as documented."""

from __future__ import annotations

import json

import pytest

from kvsi.store.hashtext import format_hash
from kvsi.subscriber import wire
from kvsi.subscriber.decode import wire_decoder
from tests.paths import WIRE

FRAMES = WIRE / "frames"


@pytest.mark.parametrize("release", ["0.25.0", "0.33.0"])
def test_captured_live_messages_decode_to_expected(release: str) -> None:
    capture = json.loads((FRAMES / f"capture_{release}.json").read_text())
    assert capture["sub_received"]
    for message in capture["sub_received"]:
        topic, seq, payload = (bytes.fromhex(f["hex"]) for f in message["frames"])
        assert topic == capture["topic"].encode()
        assert int.from_bytes(seq, "big") == message["seq"]
        decoded = wire_decoder().decode(payload)
        expected = message["expected"]
        assert decoded.ts == expected["ts"]
        assert decoded.data_parallel_rank == expected["data_parallel_rank"]
        assert [type(e).__name__ for e in decoded.events] == [e["type"] for e in expected["events"]]


def test_replay_end_marker_is_minus_one() -> None:
    reply = json.loads((FRAMES / "replay_reply_0.26+.json").read_text())
    seq_frame = bytes.fromhex(reply["end_marker"]["frames"][2]["hex"])
    assert seq_frame == wire.END_SEQ
    old = json.loads((FRAMES / "replay_reply_pre0.26.json").read_text())
    assert bytes.fromhex(old["end_marker"]["frames"][1]["hex"]) == wire.END_SEQ


def test_replayed_batch_payload_decodes() -> None:
    reply = json.loads((FRAMES / "replay_reply_0.26+.json").read_text())["reply"]
    payload = bytes.fromhex(reply["frames"][3]["hex"])
    event = wire_decoder().decode(payload).events[0]
    assert isinstance(event, wire.BlockRemoved)
    assert [format_hash(h) for h in event.block_hashes] == ["1229782938247303441"]
    assert event.group_idx == 1
