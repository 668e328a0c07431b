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
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.routing import APIRoute
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvsi.api.auth import TokenCheck
from kvsi.api.errors import error_response
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
        answer = self._answer_for(scope) if scope["type"] == "http" else None
        if answer is None or not _authorized(scope):
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

    def _answer_for(self, scope: Scope) -> Answer | None:
        """The direct answer for the request's method and path, if it is one of them."""
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


def _addressable(session_id: str) -> bool:
    """Whether FastAPI would take `session_id` as the route's path parameter, valid."""
    return _SESSION_ID.fullmatch(session_id) is not None


def _matched(scope: Scope, route: APIRoute, session_id: str) -> None:
    scope["route"] = route
    scope["path_params"] = {"session_id": session_id}


def _authorized(scope: Scope) -> bool:
    """Whether the bearer token check (if any) lets the request through, read as FastAPI's
    `HTTPBearer` reads the header; a refusal is FastAPI's to answer."""
    check: TokenCheck = scope["app"].state.token_check
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
