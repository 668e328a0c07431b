"""ZMQ frames -> (seq, payload): vLLM's live messages and both replay reply framings.

Imports the wire constants and drop reasons only; no zmq, no decoding of payloads. Pure
functions, so the fuzz tests drive them at full speed.

Live (every release): `[topic, seq, payload]`. Replay replies as a DEALER receives them:
`["", seq, payload]` before vLLM 0.26, `["", topic, seq, payload]` from 0.26; the end marker
is the same with seq all 0xff and an empty payload (`["", ff*8, ""]`, `["", "", ff*8, ""]`).
"""

from __future__ import annotations

import enum

from kvsi.subscriber.drops import DropReason
from kvsi.subscriber.wire import END_SEQ

SEQ_BYTES = 8
"""A seq frame: u64 big-endian."""


class ReplayEnd(enum.Enum):
    """The end marker of a replay reply (its own type, so it cannot pass for a batch)."""

    MARKER = "end"


Message = tuple[int, bytes]
"""A batch as framed on the wire: (seq, msgpack payload)."""


def parse_live(frames: list[bytes]) -> Message | DropReason:
    """A live message's seq and payload, or why it is skipped."""
    if len(frames) != 3:
        return DropReason.FRAME_COUNT
    seq = frames[1]
    if len(seq) != SEQ_BYTES:
        return DropReason.SEQ_FRAME
    return int.from_bytes(seq, "big"), frames[2]


def parse_reply(frames: list[bytes]) -> Message | ReplayEnd | DropReason:
    """A replay reply in either framing: a batch, the end marker, or why it is skipped.

    The seq value alone marks the end (vLLM sends -1 as signed 8 bytes): no batch can carry
    it, so a marker with a stray payload or topic still ends the reply.
    """
    count = len(frames)
    if count == 3:
        delimiter, seq, payload = frames
    elif count == 4:
        delimiter, _, seq, payload = frames
    else:
        return DropReason.FRAME_COUNT
    if delimiter:
        return DropReason.REPLY_DELIMITER
    if len(seq) != SEQ_BYTES:
        return DropReason.SEQ_FRAME
    if seq == END_SEQ:
        return ReplayEnd.MARKER
    return int.from_bytes(seq, "big"), payload


def replay_request(start_seq: int) -> list[bytes]:
    """What a DEALER sends for every buffered batch with seq >= `start_seq`."""
    return [b"", start_seq.to_bytes(SEQ_BYTES, "big")]
