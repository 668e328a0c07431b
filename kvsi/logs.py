"""Structured logging for the whole process: JSON for shippers, key=value for people.

Imports structlog and logging only.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

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
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        # structlog's own events are rendered here and written straight to stderr: the same
        # lines as through stdlib logging (two LogRecords, the handler, its formatter) at about
        # half the cost; the API writes one per request.
        processors=[*shared, renderer],
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        cache_logger_on_first_use=True,
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
