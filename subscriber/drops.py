"""Why ingest skipped something: stable labels shared by metrics and logs."""

from __future__ import annotations

import enum


class DropReason(enum.StrEnum):
    """The smallest unit skipped and why; values are Prometheus label values."""

    FRAME_COUNT = "frame_count"
    """A message without the expected number of frames: the message is skipped."""
    SEQ_FRAME = "seq_frame"
    """A seq frame that is not 8 bytes: the message is skipped."""
    NOT_MSGPACK = "not_msgpack"
    """The payload is not valid msgpack: the batch is skipped."""
    MALFORMED_BATCH = "malformed_batch"
    """Valid msgpack that is not a KVEventBatch: the batch is skipped."""
    UNKNOWN_EVENT = "unknown_event"
    """An event tag this version does not know: that event is skipped."""
    MALFORMED_EVENT = "malformed_event"
    """A known event with missing or mistyped fields: that event is skipped."""
