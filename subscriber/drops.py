"""Why ingest skipped something: stable labels shared by metrics and logs.

Imports nothing from the project: framing, decode and stream all name their drops here.
"""

from __future__ import annotations

import enum


class DropReason(enum.StrEnum):
    """The smallest unit skipped and why; values are Prometheus label values."""

    FRAME_COUNT = "frame_count"
    """A message without the expected number of frames: the message is skipped."""
    SEQ_FRAME = "seq_frame"
    """A seq frame that is not 8 bytes: the message is skipped."""
    REPLY_DELIMITER = "reply_delimiter"
    """A replay reply whose first frame is not the empty delimiter: the reply is skipped."""
    NOT_MSGPACK = "not_msgpack"
    """The payload is not valid msgpack: the batch is skipped."""
    MALFORMED_BATCH = "malformed_batch"
    """Valid msgpack that is not a KVEventBatch (nested too deep to read, or a ts that is not
    a finite number, which would poison the seq fence): the batch is skipped."""
    RANK_MISMATCH = "rank_mismatch"
    """A batch naming another data_parallel_rank than the stream's worker: the batch is
    skipped. One publisher is one worker; two seq counters cannot be ordered together."""
    UNKNOWN_EVENT = "unknown_event"
    """An event tag this version does not know: that event is skipped."""
    MALFORMED_EVENT = "malformed_event"
    """A known event with missing or mistyped fields: that event is skipped."""
    APPLY_ERROR = "apply_error"
    """A batch the store raised the same programming error on, every try (subscriber/gate.py
    `UNAPPLIABLE_AFTER`): the batch is skipped and lost (the worker DEGRADED)."""


MESSAGE_REASONS = frozenset(
    {
        DropReason.FRAME_COUNT,
        DropReason.SEQ_FRAME,
        DropReason.REPLY_DELIMITER,
        DropReason.NOT_MSGPACK,
        DropReason.MALFORMED_BATCH,
        DropReason.RANK_MISMATCH,
        DropReason.APPLY_ERROR,
    }
)
"""Reasons that skip a whole message (the others skip one event of a batch that applies)."""
