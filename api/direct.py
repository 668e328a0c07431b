"""The hot requests answered straight from ASGI, past FastAPI's per-request machinery.

Imports neither zmq nor subscriber/. `POST /v1/route`, `GET /v1/sessions/{session_id}` and
`GET /v1/sessions/{session_id}/hint` are what routers send for every request they route;
for them FastAPI's own work (matching the path against every route, its exception and
exit-stack layers, solving dependencies, building the Request) cost more than the answer.
`DirectRoutes` answers a well-formed one of these with the route's own function, validated
by the route's own models. Anything else goes on to FastAPI untouched: another path or
method, a query string other than the hint's `format`, an id that breaks its rule, a body
that is not a JSON object or does not validate, a missing or refused bearer token. So every
answer, errors included, is the one FastAPI gives: those cases are FastAPI's to word.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import structlog
from fastapi.routing import APIRoute
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvsi.api.auth import TokenCheck
from kvsi.api.errors import error_response
from kvsi.api.metrics import REQUEST_SERIES
from kvsi.api.observe import echoed_id, forget_request_id, log_request, new_request_id
from kvsi.api.params import SESSION_ID_PATTERN
from kvsi.api.routers.llm_d import routes as llm_d_routes
from kvsi.api.routes import route as route_routes
from kvsi.api.routes import sessions as session_routes

_SESSIONS = "/v1/sessions/"
_HINT = "/hint"
_SESSION_ID = re.compile(SESSION_ID_PATTERN)
_HINT_QUERIES = {
    query: llm_d_routes.HintQuery.model_validate(params)
    for query, params in (
        (b"", {}),
        (b"format=llm-d", {"format": "llm-d"}),
        (b"format=label", {"format": "label"}),
    )
}
"""The hint's query strings answered here, as FastAPI validates them; any other (a model,
an unknown or repeated name, an escape) is FastAPI's."""
_JSON = b"application/json"


def _route_of(routes: list[Any], path: str, method: str) -> APIRoute:
    """The router's route for `path` and `method`: what the request log and metrics name."""
    for candidate in routes:
        if isinstance(candidate, APIRoute) and (candidate.path, candidate.methods) == (
            path,
            {method},
        ):
            return candidate
    raise LookupError(f"no route {method} {path}")


_ROUTE = _route_of(route_routes.router.routes, "/v1/route", "POST")
_SESSION = _route_of(session_routes.router.routes, "/v1/sessions/{session_id}", "GET")
_SESSION_HINT = _route_of(llm_d_routes.router.routes, "/v1/sessions/{session_id}/hint", "GET")

Answer = Callable[[Request, bytes], Awaitable[Response | None]]
"""A direct answer to a request and its body, or None: the request is FastAPI's after all."""


class DirectRoutes:
    """ASGI middleware answering the hot requests itself when they are well formed, and
    passing every other request (and the body it read, if any) on to the app.

    Innermost of the app's middleware: the request log and metrics (`RequestMetrics`) and
    the body rules (`RequestBodies`) stay around it. It sets `route` and `path_params` in
    the scope as FastAPI's router does, so the log line names the route template and the
    session.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = answer_for(scope) if scope["type"] == "http" else None
        if answer is None or not _authorized(scope, scope["app"].state.token_check):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        body: bytes | None = None
        try:
            if scope["method"] == "POST":
                body = await request.body()
            response = await answer(request, body or b"")
        except HTTPException as exc:
            response = error_response(exc)
        if response is None:
            await self.app(scope, _replayed(body, receive), send)
            return
        await response(scope, receive, send)


def answer_for(scope: Scope) -> Answer | None:
    """The direct answer for the request's method and path, if it is one of them; it sets
    the scope's `route` and `path_params` as FastAPI's router would."""
    if scope.get("root_path"):
        return None  # behind a prefix: FastAPI's router knows how to strip it
    path: str = scope["path"]
    method: str = scope["method"]
    if method == "POST" and path == "/v1/route":
        if _media_type(scope) != _JSON:
            return None  # FastAPI would not parse it as JSON: its error to word
        scope["route"] = _ROUTE
        scope["path_params"] = {}
        return _route
    if method != "GET" or not path.startswith(_SESSIONS):
        return None
    if path.endswith(_HINT):
        session_id = path[len(_SESSIONS) : -len(_HINT)]
        if not _addressable(session_id) or scope["query_string"] not in _HINT_QUERIES:
            return None
        _matched(scope, _SESSION_HINT, session_id)
        return _hint
    session_id = path[len(_SESSIONS) :]
    if not _addressable(session_id) or scope["query_string"]:
        return None
    _matched(scope, _SESSION, session_id)
    return _session


class DirectServer:
    """The hot requests answered for the HTTP server itself (kvsi.http), without an ASGI
    cycle: no scope passed through the middleware, no Request/Response round of ASGI
    messages, no task per request. What the middleware does for them is done here, in the
    same order: the request id (taken or made, bound to every log line the request causes,
    echoed), the duration observed at the response's start, the count and the request's
    log line after it. A request it declines (`answer` returns False: not one of the hot
    requests, not authorized, a body FastAPI words an error for) goes to the app as it came.

    Only where the ASGI stack around the routes is the app's own: not behind a `root_path`,
    not while tracing (the span middleware would be skipped). `eager`: the store's reads
    never wait, so the server may run an answer's first step outside any task."""

    def __init__(
        self, app: Starlette, *, access_log: bool, max_body_bytes: int, eager: bool
    ) -> None:
        self.eager = eager
        self._app = app
        self._access_log = access_log
        self._max_body_bytes = max_body_bytes
        self._series = REQUEST_SERIES
        self._token_check: TokenCheck = app.state.token_check

    def takes(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        """Whether the request may be one of the hot ones, from its head alone: the server
        then holds its body (a small one) and calls `answer` once it is complete. A POST
        only with a JSON body of a declared length within the limit: any other is refused
        or reread by the app's body rules (api/body.py), and is the app's to answer."""
        if method == "GET":
            return path.startswith(_SESSIONS)
        if method != "POST" or path != "/v1/route":
            return False
        length: int | None = None
        media = b""
        for name, value in headers:
            if name == b"content-length":
                length = int(value) if value.isdigit() else None
            elif name == b"content-type":
                media = value.split(b";", 1)[0].strip().lower()
        return media == _JSON and length is not None and length <= self._max_body_bytes

    async def answer(self, scope: Scope, body: bytes, reply: Reply) -> bool:
        """Answer the request through `reply` (status, headers, body) and return True, or
        return False, having replied nothing, for the app to answer it."""
        started = time.perf_counter()
        scope["app"] = self._app
        answer = answer_for(scope)
        if answer is None or not _authorized(scope, self._token_check):
            _forget(scope)
            return False
        rid = new_request_id(scope)
        structlog.contextvars.bind_contextvars(request_id=rid)
        try:
            response = await answer(Request(scope), body)
        except HTTPException as exc:
            response = error_response(exc)
        if response is None:
            _forget(scope)
            return False
        method: str = scope["method"]
        route: str = scope["route"].path
        status = response.status_code
        self._series.timer(method, route).observe(time.perf_counter() - started)
        reply(status, [*response.raw_headers, echoed_id(rid)], bytes(response.body))
        elapsed = time.perf_counter() - started
        self._series.count(method, route, status).inc()
        if self._access_log:
            log_request(scope, route, status, elapsed)
        return True


Reply = Callable[[int, list[tuple[bytes, bytes]], bytes], None]
"""How `DirectServer.answer` answers: the status, the headers, the body."""


def direct_server(app: Starlette) -> DirectServer | None:
    """The app's `DirectServer`, if create_app made it one."""
    found = getattr(app.state, "direct_server", None)
    return found if isinstance(found, DirectServer) else None


def _forget(scope: Scope) -> None:
    """Take back what a declined answer wrote into the scope: the app's own layers set it."""
    for key in ("app", "route", "path_params"):
        scope.pop(key, None)
    forget_request_id(scope)


def _addressable(session_id: str) -> bool:
    """Whether FastAPI would take `session_id` as the route's path parameter, valid."""
    return _SESSION_ID.fullmatch(session_id) is not None


def _matched(scope: Scope, route: APIRoute, session_id: str) -> None:
    scope["route"] = route
    scope["path_params"] = {"session_id": session_id}


def _authorized(scope: Scope, check: TokenCheck) -> bool:
    """Whether the bearer token check (if any) lets the request through, read as FastAPI's
    `HTTPBearer` reads the header; a refusal is FastAPI's to answer."""
    if not check.enabled:
        return True
    header = next((v for k, v in scope["headers"] if k.lower() == b"authorization"), None)
    if header is None:
        return False
    scheme, token = get_authorization_scheme_param(header.decode("latin-1"))
    return scheme.lower() == "bearer" and bool(token) and check.accepts(token)


async def _session(request: Request, body: bytes) -> Response:
    return await session_routes.get_session(request.path_params["session_id"], request)


async def _hint(request: Request, body: bytes) -> Response:
    state = request.app.state
    return await llm_d_routes.session_hint(
        request.path_params["session_id"],
        state.reader,
        state.hint_options,
        _HINT_QUERIES[request.scope["query_string"]],
    )


async def _route(request: Request, body: bytes) -> Response | None:
    """The route's answer for a JSON object body that validates, else None."""
    try:
        data = json.loads(body)
    except Exception:  # as FastAPI: any failure to decode (RecursionError too) is an error
        return None
    if not isinstance(data, dict):
        return None
    try:
        parsed = route_routes.RouteRequest.model_validate(data)
    except ValidationError:
        return None
    return await route_routes.route(parsed, request)


def _media_type(scope: Scope) -> bytes:
    for name, value in scope["headers"]:
        if name.lower() == b"content-type":
            media: bytes = value.split(b";", 1)[0]
            return media.strip().lower()
    return b""


def _replayed(body: bytes | None, receive: Receive) -> Receive:
    """`receive`, giving first the body the direct answer already read (None: it read
    none): FastAPI reads it again."""
    if body is None:
        return receive
    pending: bytes | None = body

    async def replay() -> Message:
        nonlocal pending
        if pending is None:
            return await receive()
        message: Message = {"type": "http.request", "body": pending, "more_body": False}
        pending = None
        return message

    return replay
