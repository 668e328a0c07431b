"""Structured logging for the whole process: JSON for shippers, key=value for people.

Imports structlog and logging only.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO, cast

import structlog

_PLAIN_KEYS = frozenset({"exception", "stack"})
"""Rendered tracebacks: multi-line by design, and written by this process, not a client."""


def escape_control_characters(
    logger: Any, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Write each string value's control characters (NUL, newline, ESC...) as escapes.

    A value a client chose (a path, an id) may hold any of them once percent-decoded: raw,
    a NUL or ESC reaches the terminal or the shipper, and a newline forges a log line.
    """
    for key, value in event.items():
        if isinstance(value, str) and not value.isprintable() and key not in _PLAIN_KEYS:
            event[key] = "".join(
                c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in value
            )
    return event


class UtcStamper:
    """structlog's `TimeStamper(fmt="iso", utc=True)`: the event's `timestamp`, now in UTC as
    `datetime.isoformat` writes it (`2026-12-05T16:24:44.123456Z`, the microseconds left out
    when they are 0), with its date and time of day formatted once a second, not per line."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def __call__(
        self, logger: Any, method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        event["timestamp"] = self.stamp(time.time_ns())
        return event

    def stamp(self, ns: int) -> str:
        """The stamp of `ns` nanoseconds since the epoch (microseconds truncated, as
        `datetime.now` takes the clock)."""
        second, rest = divmod(ns, 1_000_000_000)
        if second != self._second:
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        micro = rest // 1000
        return f"{self._prefix}.{micro:06d}Z" if micro else f"{self._prefix}Z"


def configure_logging(level: str, fmt: str) -> None:
    """Render structlog's and stdlib logging's (uvicorn's too) events with one renderer, to
    stderr."""
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        # Plain tracebacks: the default pretty renderer (rich, with locals) spent about a second
        # of the event loop per logged exception, turning a Redis outage's 503s into timeouts.
        else structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
    )
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        escape_control_characters,
        structlog.processors.add_log_level,
        UtcStamper(),
    ]
    processors = [*shared, renderer]
    wrapper = structlog.make_filtering_bound_logger(logging.getLevelName(level.upper()))
    structlog.configure(
        # structlog's own events are rendered here and written straight to stderr: the same
        # lines as through stdlib logging (two LogRecords, the handler, its formatter) at about
        # half the cost; the API writes one per request.
        processors=processors,
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        wrapper_class=wrapper,
        cache_logger_on_first_use=True,
    )
    global _lines
    _lines = None
    if fmt == "json" or not sys.stderr.isatty():
        _lines = _InfoLines(
            json=fmt == "json",
            out=sys.stderr,
            enabled=logging.getLevelName(level.upper()) <= logging.INFO,
            processors=processors,
            wrapper=wrapper,
        )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level.upper())


_lines: _InfoLines | None = None


def info_line(event: str, fields: dict[str, Any]) -> bool:
    """Log `event` with `fields` at info as `log.info(event, **fields)` would under the
    configuration `configure_logging` made, byte for byte, without structlog's bound logger
    (the API's line per request: tests/kvsi/test_logs.py compares the two). False, with
    nothing written, under any other configuration (a test's capture, colours on a
    terminal): the caller logs through structlog."""
    lines = _lines
    return lines is not None and lines.write(event, fields)


_LEVEL = "[info     ]"
"""The console renderer's level column without colours: padded to its longest level name."""
_EVENT_WIDTH = 30
"""The console renderer's default `pad_event_to`."""
_APART = frozenset({"logger", "logger_name", "stack", "exception", "exc_info"})
"""Names the console renderer treats apart from the other fields."""
_QUOTED = frozenset(" \t=\r\n\"'")
"""Characters for which the console renderer writes a string value as its repr."""


_Prepare = Callable[[Any, str, structlog.typing.EventDict], structlog.typing.EventDict]


class _InfoLines:
    """`configure_logging`'s chain for an info event, called directly: its processors (context
    variables, escaped control characters, level, UTC timestamp), then its JSON renderer or,
    for the console, `_console`: structlog's ConsoleRenderer costs most of the line (its
    columns and styles), so its columns without colours are written here."""

    def __init__(
        self,
        *,
        json: bool,
        out: TextIO,
        enabled: bool,
        processors: list[structlog.types.Processor],
        wrapper: type[structlog.typing.BindableLogger],
    ) -> None:
        self._out = structlog.WriteLogger(out)
        self._enabled = enabled
        self._processors = list(processors)
        # Every processor but the renderer returns the event dict it was given.
        self._prepare = cast(list[_Prepare], self._processors[:-1])
        self._render = self._processors[-1] if json else _console
        self._wrapper = wrapper

    def write(self, event: str, fields: dict[str, Any]) -> bool:
        config = structlog.get_config()
        if config["processors"] != self._processors or config["wrapper_class"] is not self._wrapper:
            return False  # configured otherwise since: structlog's to render
        if not self._enabled:
            return True
        entry: structlog.typing.EventDict = {**fields, "event": event}
        for process in self._prepare:
            entry = process(None, "info", entry)
        if not _APART.isdisjoint(entry):
            return False  # a name the renderer treats apart: structlog's to render
        self._out.msg(str(self._render(None, "info", entry)))
        return True


def _console(logger: Any, method: str, entry: structlog.typing.EventDict) -> str:
    """structlog's ConsoleRenderer's line for an info `entry` without colours (no exception)."""
    timestamp = entry.pop("timestamp")
    entry.pop("level")
    event = str(entry.pop("event"))
    pairs = [f"{key}={_repr(entry[key])}" for key in sorted(entry)]
    line = f"{timestamp} {_LEVEL} {event.ljust(_EVENT_WIDTH)} {' '.join(pairs)}"
    return line.rstrip(" ")


def _repr(value: Any) -> str:
    if isinstance(value, str) and _QUOTED.isdisjoint(value):
        return value
    return repr(value)
