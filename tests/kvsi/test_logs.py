"""`kvsi.logs.info_line` writes, byte for byte, the line structlog's chain (as
`configure_logging` sets it up) writes for the same info event, in both formats; under any
other configuration it writes nothing and says so."""

from __future__ import annotations

import contextvars
import datetime
import io
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from kvsi.logs import UtcStamper, configure_logging, info_line

FIELDS: list[dict[str, Any]] = [
    {},
    {
        "method": "GET",
        "route": "/v1/sessions/{session_id}",
        "path": "/v1/sessions/s",
        "status": 200,
    },
    {"duration_ms": 0.432, "session_id": "sess-1", "pod": "vllm-0"},
    {"path": "/v1/sessions/with space", "quote": "it's", "dq": 'say "x"', "eq": "a=b"},
    {"control": "a\nb\x1bc\x00", "tab": "a\tb", "cr": "a\rb", "unicode": "séance ✓"},
    {"none": None, "true": True, "big": 2**70, "negative": -1, "nan": float("nan")},
    {"zeta": 1, "alpha": 2, "Mid": 3, "_under": 4},
    {"level": "spoofed", "timestamp": "spoofed"},
    {"long_event_padding": "x" * 300},
]
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z")


@pytest.fixture
def restored() -> Iterator[None]:
    """structlog's configuration and stderr as they were."""
    before = structlog.get_config()
    err = sys.stderr
    yield
    sys.stderr = err
    structlog.configure(**before)


def lines(fmt: str, fields: dict[str, Any], event: str) -> tuple[str, str]:
    """The same event through structlog and through `info_line`, timestamps masked."""
    out = io.StringIO()
    sys.stderr = out
    configure_logging("info", fmt)
    log = structlog.get_logger("kvsi.test")

    def both() -> None:
        structlog.contextvars.bind_contextvars(request_id="rid-1", other="o t")
        log.info(event, **fields)
        assert info_line(event, fields)

    contextvars.copy_context().run(both)
    written = out.getvalue().split("\n")
    assert len(written) == 3 and written[2] == "", written
    return TIMESTAMP.sub("T", written[0]), TIMESTAMP.sub("T", written[1])


@pytest.mark.parametrize("fmt", ["console", "json"])
@pytest.mark.parametrize("fields", FIELDS)
@pytest.mark.usefixtures("restored")
def test_a_line_is_structlogs_line(fmt: str, fields: dict[str, Any]) -> None:
    for event in ("http.request", "an event longer than the thirty characters of padding"):
        through_structlog, direct = lines(fmt, fields, event)
        assert direct == through_structlog


@pytest.mark.usefixtures("restored")
def test_under_another_configuration_it_writes_nothing() -> None:
    out = io.StringIO()
    sys.stderr = out
    configure_logging("info", "json")
    with structlog.testing.capture_logs() as captured:
        assert not info_line("http.request", {"status": 200})
    assert captured == [] and out.getvalue() == ""
    configure_logging("warning", "json")
    assert info_line("http.request", {"status": 200}), "filtered out, as log.info would be"
    assert out.getvalue() == ""


@pytest.mark.parametrize(
    "ns",
    [
        0,
        1_000,
        999_999_999,
        1_764_950_684_000_000_000,
        1_764_950_684_000_000_999,
        1_764_950_684_000_001_000,
        1_764_950_684_123_456_789,
        1_764_950_684_999_999_999,
        1_764_950_685_000_000_000,
        4_102_444_800_500_000_000,
    ],
)
def test_the_stamp_is_datetimes_iso_utc(ns: int) -> None:
    """As structlog's TimeStamper(fmt="iso", utc=True) writes `datetime.now(timezone.utc)`,
    whose clock reading is truncated to microseconds; twice, the second time from the
    second it formatted."""
    stamper = UtcStamper()
    when = datetime.datetime.fromtimestamp(ns // 10**9, datetime.UTC).replace(
        microsecond=ns % 10**9 // 1000
    )
    expected = when.isoformat().replace("+00:00", "Z")
    assert stamper.stamp(ns) == expected
    assert stamper.stamp(ns) == expected


def test_one_stamper_across_seconds() -> None:
    stamper = UtcStamper()
    assert stamper.stamp(1_764_950_684_999_999_000) == "2025-12-05T16:04:44.999999Z"
    assert stamper.stamp(1_764_950_685_000_001_000) == "2025-12-05T16:04:45.000001Z"
    assert stamper.stamp(1_764_950_684_500_000_000) == "2025-12-05T16:04:44.500000Z"


def test_the_stamper_stamps_now_where_structlogs_does() -> None:
    theirs = structlog.processors.TimeStamper(fmt="iso", utc=True)(None, "info", {})
    ours = UtcStamper()(None, "info", {})
    assert list(ours) == list(theirs) == ["timestamp"]
    assert TIMESTAMP.fullmatch(ours["timestamp"]), ours
    parse = datetime.datetime.fromisoformat
    assert abs(parse(ours["timestamp"]) - parse(theirs["timestamp"])).total_seconds() < 5
