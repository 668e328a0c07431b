"""Following one request: its id (`X-Request-ID`, taken or made, echoed, in every log line
it causes) and, when tracing is on, its span under the caller's trace (`traceparent`).

Imports starlette and structlog; opentelemetry only once kvsi.tracing has turned tracing on,
so the API runs without the `otel` extra.
"""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING

import structlog
from fastapi.telemetry import TelemetryConfig
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvsi.logs import info_line
from kvsi.tracing import tracer

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

HEADER = "x-request-id"
_HEADER_BYTES = HEADER.encode()
_VALID_ID = re.compile(rb"[\x21-\x7e]{1,128}")
"""A caller's id is kept if it is 1 to 128 visible ASCII characters; any other is replaced:
it goes into every log line and the response, so it must not forge either."""
_ID_KEY = "kvsi.request_id"
"""Where the request's id waits in the ASGI scope (a mounted app sees its parent's)."""
_TRACED_KEY = "kvsi.traced"

LOGGED_TEXT = 256
"""Longest path or id a request's log line carries; longer ones are cut (their length
said), so a client cannot make one request write kilobytes of log."""

log = structlog.get_logger("kvsi.api.app")

NO_NATIVE_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}
"""FastAPI's own OpenTelemetry off, for every app: a request's span is kvsi's (`Spans`), on
the provider the OTEL_* variables configure. FastAPI's would add a second server span (and
spans of its own) under any global provider, e.g. auto-instrumentation's, and checks for
one on every request."""


def route_of(scope: Scope) -> str:
    """The matched route's template (`/v1/sessions/{session_id}`), or `unmatched`."""
    matched = scope.get("route")
    path = getattr(matched, "path", None)
    return path if isinstance(path, str) else "unmatched"


def request_id(scope: Scope) -> str | None:
    """The id RequestIds gave the request, if it ran."""
    found = scope.get(_ID_KEY)
    return found if isinstance(found, str) else None


def new_request_id(scope: Scope) -> str:
    """The request's id: the caller's `X-Request-ID` if usable, else a new one; kept in the
    scope (`request_id`)."""
    given = [v for k, v in scope["headers"] if k == _HEADER_BYTES]
    usable = given and _VALID_ID.fullmatch(given[0])
    rid = given[0].decode("ascii") if usable else _uuid4_hex()
    scope[_ID_KEY] = rid
    return rid


def _uuid4_hex() -> str:
    """`uuid.uuid4().hex` without the UUID object, and from `random`'s generator (seeded from
    the OS, seeded again in a forked child), not a system call per request: an id names a
    request in logs and traces, it guards nothing. The version and variant bits are set as
    RFC 4122 says."""
    return "%032x" % (random.getrandbits(128) & _UUID4_CLEARED | _UUID4_SET)


_UUID4_CLEARED = ~((0xC000 << 48) | (0xF000 << 64))
_UUID4_SET = (0x8000 << 48) | (4 << 76)


def forget_request_id(scope: Scope) -> None:
    """Drop the id `new_request_id` kept: the request goes to `RequestIds` after all."""
    scope.pop(_ID_KEY, None)


def echoed_id(rid: str) -> tuple[bytes, bytes]:
    """The response header that echoes the request's id."""
    return (_HEADER_BYTES, rid.encode("ascii"))


def log_request(scope: Scope, route: str, status: int, elapsed: float) -> None:
    """A request's log line: the route template, the path cut to `LOGGED_TEXT` characters,
    and the session and pod the path names (an id longer than that is left to the cut path,
    not logged twice); kvsi.logs escapes control characters."""
    params = scope.get("path_params", {})
    fields = {
        "method": scope["method"],
        "route": route,
        "path": _cut(scope["path"]),
        "status": status,
        "duration_ms": round(elapsed * 1000, 3),
    }
    for name in ("session_id", "pod"):
        if name in params and len(params[name]) <= LOGGED_TEXT:
            fields[name] = params[name]
    if not info_line("http.request", fields):
        log.info("http.request", **fields)


def _cut(text: str) -> str:
    """`text`, or its first `LOGGED_TEXT` characters and how long it was."""
    if len(text) <= LOGGED_TEXT:
        return text
    return f"{text[:LOGGED_TEXT]}... ({len(text)} characters)"


class RequestIds:
    """Outermost middleware: the request's `X-Request-ID` (the caller's if usable, else a new
    one) is bound to every log line written while the request runs, and echoed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _ID_KEY in scope:
            await self.app(scope, receive, send)
            return
        rid = new_request_id(scope)
        echoed = echoed_id(rid)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), echoed]}
            await send(message)

        with structlog.contextvars.bound_contextvars(request_id=rid):
            await self.app(scope, receive, send_with_id)


class Spans:
    """A server span per request, child of the caller's trace context (`traceparent`, or
    whatever OTEL_PROPAGATORS names), named by method and route template, with the status,
    the request id and the session or pod the path names. Added only while tracing is on."""

    def __init__(self, app: ASGIApp, tracer: Tracer) -> None:
        from opentelemetry import propagate
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self.app = app
        self.tracer = tracer
        self._extract = propagate.extract
        self._server = SpanKind.SERVER
        self._error = Status(StatusCode.ERROR)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _TRACED_KEY in scope:
            await self.app(scope, receive, send)
            return
        scope[_TRACED_KEY] = True
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        method = scope["method"]
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with self.tracer.start_as_current_span(
            method,
            context=self._extract(carrier),
            kind=self._server,
            attributes={"http.request.method": method, "url.path": scope["path"]},
        ) as span:
            try:
                await self.app(scope, receive, send_status)
            finally:
                route = route_of(scope)
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                rid = request_id(scope)
                if rid is not None:
                    span.set_attribute("kvsi.request_id", rid)
                params = scope.get("path_params", {})
                for name in ("session_id", "pod"):
                    if name in params:
                        span.set_attribute(f"kvsi.{name}", params[name])
                if status >= 500:
                    span.set_status(self._error)


def observe(app: Starlette) -> None:
    """Add the outermost middlewares: a span per request while tracing is on, then the
    request id around everything, so every log line of the request carries it."""
    traced = tracer()
    if traced is not None:
        app.add_middleware(Spans, tracer=traced)
    app.add_middleware(RequestIds)
