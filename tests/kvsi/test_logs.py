"""`kvsi.logs.info_line` writes, byte for byte, the line structlog's chain (as
`configure_logging` sets it up) writes for the same info event, in both formats; under any
other configuration it writes nothing and says so."""

from __future__ import annotations

import contextvars
import io
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from kvsi.logs import configure_logging, info_line

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
