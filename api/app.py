"""The API's factory: builds the FastAPI app around a store the caller already opened.

Imports neither zmq nor subscriber/ (tests/api checks it). The caller owns the store's
lifecycle (open, close), so one store can be shared with ingest in the same process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from fastapi_offline import FastAPIOffline
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvsi.api.auth import UNAUTHORIZED, TokenCheck, require_token
from kvsi.api.body import DEFAULT_MAX_BODY_BYTES, RequestBodies
from kvsi.api.direct import DirectRoutes, DirectServer
from kvsi.api.errors import install_error_handlers
from kvsi.api.metrics import REQUEST_SERIES
from kvsi.api.observe import NO_NATIVE_TELEMETRY, RequestIds, log_request, observe, route_of
from kvsi.api.reader import guarded_reader
from kvsi.api.routers.llm_d import routes as llm_d_routes
from kvsi.api.routers.llm_d.hints import HintOptions
from kvsi.api.routes import health, metrics, pods, route, sessions, watch
from kvsi.api.routes.health import ReadinessCheck
from kvsi.store.base import IndexStore
from kvsi.store.memory import MemoryStore
from kvsi.tracing import tracer
from kvsi.version import package_version

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
"""Methods labelled as themselves; any other is `OTHER`, so a scanner cannot mint series."""

STATIC = Path(__file__).parent / "static"
"""The dashboard's files, shipped inside the package (no front-end build step)."""

DESCRIPTION = """\
Per-session index of vLLM KV-cache blocks, built from vLLM's KV events.

Answers "where does session S's working memory live right now, and how much of it is
left?" for cache-aware routers and for the people who operate them.

- A **worker** is one event publisher: a pod and one of its data-parallel ranks.
- A worker's `state` says how far its numbers can be trusted: only `live` is exact.
- **Block hashes are strings**: decimal for integer hashes (often above 2^63), `0x` +
  lowercase hex for byte digests. Never JSON numbers.
- **Timestamps** are Unix seconds (floats). `last_seen` is the engine's batch timestamp;
  `state_since` and `last_event_at` are this service's clock.
- **Paging**: pass a response's `next_cursor` as `cursor`; `next_cursor` is null on the last
  page. `limit` is 1..1000 (default 100).
- **Metrics**: Prometheus text at `/metrics`.
- **Access**: when the service is configured with bearer tokens, every `/v1` endpoint needs
  `Authorization: Bearer <token>` (401 without or with a wrong one). `/healthz`, `/readyz`
  and (unless configured otherwise) `/metrics` stay open.
- **Errors** are `{"detail": "..."}`: 400 for any bad parameter or body (cursor included),
  404 for an unknown session or pod, 413 for a body over the configured limit, 503 when the
  index store is unavailable.
- **Bodies** are read as JSON whatever their `Content-Type` says (`curl -d` works as is).
"""


def create_app(
    store: IndexStore,
    *,
    readiness: ReadinessCheck | None = None,
    readiness_timeout: float = 2.0,
    title: str = "kv-session-index",
    version: str | None = None,
    root_path: str = "",
    tokens: Sequence[str] = (),
    metrics_require_token: bool = False,
    hint_options: HintOptions | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    direct_routes: bool = True,
    access_log: bool = True,
) -> FastAPI:
    """The REST app over `store`, which the caller opens before and closes after.

    `readiness` returns why the service is not ready (empty: ready); None means ready as
    soon as it serves. It is bounded by `readiness_timeout` seconds, so a hung dependency
    reads as "not ready" instead of hanging the kubelet's probe. `root_path` is for a
    reverse proxy that serves the app under a prefix. `tokens`: bearer tokens every `/v1`
    endpoint requires (none: open); the probes stay open, `/metrics` too unless
    `metrics_require_token`. `hint_options`: how session hints name llm-d endpoints
    (default: namespace `default`, `<pod>-rank-<rank>`). A request body over
    `max_body_bytes` is a 413, refused before it is read whole. Swagger UI (`/docs`) is
    served from the package's own files (fastapi-offline), not a CDN. `direct_routes`:
    answer the hot requests past FastAPI's per-request machinery (api/direct.py), with the
    same answers; False sends every request through FastAPI (the tests compare the two).
    `access_log`: one log line per request (off: only the metrics count them).
    `app.state.direct_server` (api/direct.py) is for kvsi's HTTP server: the hot answers
    without an ASGI cycle.
    """
    app = FastAPIOffline(
        title=title,
        version=version or package_version(),
        description=DESCRIPTION,
        root_path=root_path,
        docs_url="/docs",
        redoc_url=None,
        telemetry=NO_NATIVE_TELEMETRY,
    )
    app.state.store = store
    app.state.reader = guarded_reader(store)
    # Whether a request's independent reads should run at once: those of a store over the
    # network overlap their round trips; the memory store's never wait.
    app.state.overlap_reads = not isinstance(store, MemoryStore)
    app.state.readiness = readiness
    app.state.readiness_timeout = readiness_timeout
    app.state.token_check = TokenCheck(tokens)
    app.state.hint_options = hint_options or HintOptions()
    app.state.stopping = asyncio.Event()
    install_error_handlers(app)
    if direct_routes:
        app.add_middleware(DirectRoutes)
    # The same answers served by the HTTP server itself (kvsi.http), where nothing but the
    # app's own layers stands around the routes: no prefix to strip, no span per request.
    app.state.direct_server = (
        DirectServer(
            app,
            access_log=access_log,
            max_body_bytes=max_body_bytes,
            eager=not app.state.overlap_reads,
        )
        if direct_routes and not root_path and tracer() is None
        else None
    )
    app.add_middleware(RequestBodies, max_bytes=max_body_bytes)
    app.add_middleware(RequestMetrics, access_log=access_log)
    observe(app)
    # Documented in OpenAPI only where enforced, so the schema tells clients the truth.
    protected = [Depends(require_token)] if tokens else []
    unauthorized = UNAUTHORIZED if tokens else {}
    app.include_router(sessions.router, dependencies=protected, responses=unauthorized)
    app.include_router(llm_d_routes.router, dependencies=protected, responses=unauthorized)
    app.include_router(pods.router, dependencies=protected, responses=unauthorized)
    app.include_router(route.router, dependencies=protected, responses=unauthorized)
    app.include_router(watch.router, dependencies=protected, responses=unauthorized)
    app.include_router(health.router)
    guard_metrics = bool(tokens) and metrics_require_token
    app.include_router(
        metrics.router,
        dependencies=protected if guard_metrics else [],
        responses=unauthorized if guard_metrics else {},
    )
    _serve_dashboard(app)
    _document_400_not_422(app)
    return app


def _serve_dashboard(app: FastAPI) -> None:
    """The dashboard at `/`, open like the probes: the page holds no data, and the `/v1` calls
    it makes carry the bearer token it asks for."""

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")


def stop_streams(app: Starlette) -> None:
    """Tell the app's open streams (`/v1/watch`) to end: a graceful shutdown waits for every
    open response, and a stream has no end of its own. Apps without streams ignore it."""
    stopping = getattr(app.state, "stopping", None)
    if stopping is not None:
        stopping.set()


def create_probe_app(
    *, readiness: ReadinessCheck | None = None, readiness_timeout: float = 2.0
) -> FastAPI:
    """Only /healthz, /readyz and /metrics: what an ingest-only process serves, so the
    kubelet can probe it and Prometheus can scrape its ingest metrics."""
    app = FastAPI(
        title="kv-session-index (ingest)",
        docs_url=None,
        redoc_url=None,
        telemetry=NO_NATIVE_TELEMETRY,
    )
    app.state.readiness = readiness
    app.state.readiness_timeout = readiness_timeout
    app.add_middleware(RequestMetrics)
    app.add_middleware(RequestIds)
    app.include_router(health.router)
    app.include_router(metrics.router)
    return app


class RequestMetrics:
    """Counts, times and logs every HTTP request by route template, never by raw path (one
    series per session id would swamp Prometheus); the log line (`log_request`) carries the
    session and pod the path names, so a shipper can follow one session's queries."""

    def __init__(self, app: ASGIApp, *, access_log: bool = True) -> None:
        self.app = app
        self._access_log = access_log
        self._series = REQUEST_SERIES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"] if scope["method"] in METHODS else "OTHER"
        started = time.perf_counter()
        status = 500  # what the server answers if the app raises before responding
        timed = False

        async def timed_send(message: Message) -> None:
            nonlocal status, timed
            if message["type"] == "http.response.start":
                status = message["status"]
                timed = True
                self._series.timer(method, route_of(scope)).observe(time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            elapsed = time.perf_counter() - started
            route_name = route_of(scope)
            if not timed:
                self._series.timer(method, route_name).observe(elapsed)
            self._series.count(method, route_name, status).inc()
            if self._access_log:
                log_request(scope, route_name, status, elapsed)


def _document_400_not_422(app: FastAPI) -> None:
    """Make OpenAPI match api.errors: bad parameters answer 400, never FastAPI's 422."""
    build = app.openapi

    def openapi() -> dict[str, object]:
        if app.openapi_schema is None:
            schema = build()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            components = schema.get("components", {}).get("schemas", {})
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
