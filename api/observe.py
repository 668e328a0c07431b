"""Following one request: its id (`X-Request-ID`, taken or made, echoed, in every log line
it causes) and, when tracing is on, its span under the caller's trace (`traceparent`).

Imports starlette and structlog; opentelemetry only once kvsi.tracing has turned tracing on,
so the API runs without the `otel` extra.
"""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING

import structlog
from fastapi.telemetry import TelemetryConfig
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


class RequestIds:
    """Outermost middleware: the request's `X-Request-ID` (the caller's if usable, else a new
    one) is bound to every log line written while the request runs, and echoed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _ID_KEY in scope:
            await self.app(scope, receive, send)
            return
        given = [v for k, v in scope["headers"] if k == _HEADER_BYTES]
        usable = given and _VALID_ID.fullmatch(given[0])
        rid = given[0].decode("ascii") if usable else uuid.uuid4().hex
        scope[_ID_KEY] = rid
        echoed = (_HEADER_BYTES, rid.encode("ascii"))

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
