"""Live and replay framing of every release, from the captured frames; bad framing by reason."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvsi.subscriber.drops import DropReason
from kvsi.subscriber.framing import ReplayEnd, parse_live, parse_reply, replay_request
from kvsi.subscriber.wire import END_SEQ
from tests.paths import WIRE

FRAMES = WIRE / "frames"


def frames_of(items: list[dict[str, Any]]) -> list[bytes]:
    return [bytes.fromhex(f["hex"]) for f in items]


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FRAMES / name).read_text())
    return data


def test_live_message_gives_seq_and_payload() -> None:
    live = load("live_message.json")
    frames = frames_of(live["frames"])
    assert parse_live(frames) == (7, frames[2])


@pytest.mark.parametrize("name", ["replay_reply_0.26+.json", "replay_reply_pre0.26.json"])
def test_both_reply_framings_and_both_end_markers(name: str) -> None:
    reply = load(name)
    frames = frames_of(reply["reply"]["frames"])
    assert parse_reply(frames) == (reply["reply"]["seq"], frames[-1])
    assert parse_reply(frames_of(reply["end_marker"]["frames"])) is ReplayEnd.MARKER


@pytest.mark.parametrize("release", ["0.25.0", "0.33.0"])
def test_every_captured_exchange_parses(release: str) -> None:
    capture = load(f"capture_{release}.json")
    for message in capture["sub_received"]:
        assert parse_live(frames_of(message["frames"])) == (
            message["seq"],
            bytes.fromhex(message["frames"][2]["hex"]),
        )
    for exchange in capture["dealer_exchanges"]:
        request = frames_of(exchange["request_sent_by_dealer"])
        assert request == replay_request(int.from_bytes(request[1], "big"))
        for reply in exchange["replies_received_by_dealer"]:
            parsed = parse_reply(frames_of(reply["frames"]))
            if reply["kind"] == "end_marker":
                assert parsed is ReplayEnd.MARKER
            else:
                assert isinstance(parsed, tuple) and parsed[0] == reply["seq"]


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], DropReason.FRAME_COUNT),
        ([b"topic", b"\x00" * 8], DropReason.FRAME_COUNT),
        ([b"t", b"\x00" * 8, b"p", b"extra"], DropReason.FRAME_COUNT),
        ([b"t", b"\x00" * 7, b"p"], DropReason.SEQ_FRAME),
        ([b"t", b"\x00" * 9, b"p"], DropReason.SEQ_FRAME),
    ],
)
def test_bad_live_framing_is_named(frames: list[bytes], reason: DropReason) -> None:
    assert parse_live(frames) is reason


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([b""], DropReason.FRAME_COUNT),
        ([b"", b"t", b"\x00" * 8, b"p", b"x"], DropReason.FRAME_COUNT),
        ([b"x", b"\x00" * 8, b"p"], DropReason.REPLY_DELIMITER),
        ([b"", b"t", b"\x00" * 4, b"p"], DropReason.SEQ_FRAME),
    ],
)
def test_bad_reply_framing_is_named(frames: list[bytes], reason: DropReason) -> None:
    assert parse_reply(frames) is reason


def test_the_end_seq_ends_a_reply_even_with_a_stray_payload() -> None:
    assert parse_reply([b"", END_SEQ, b"junk"]) is ReplayEnd.MARKER
    assert parse_reply([b"", b"topic", END_SEQ, b""]) is ReplayEnd.MARKER
