"""The API's factory: builds the FastAPI app around a store the caller already opened.

Imports neither zmq nor subscriber/ (tests/api checks it). The caller owns the store's
lifecycle (open, close), so one store can be shared with ingest in the same process.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version

from fastapi import Depends, FastAPI

from api.auth import UNAUTHORIZED, TokenCheck, require_token
from api.errors import install_error_handlers
from api.reader import IndexReader
from api.routes import health, metrics, pods, route, sessions, watch
from api.routes.health import ReadinessCheck
from store.base import IndexStore

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
- **Errors** are `{"detail": "..."}`: 400 for any bad parameter (cursor included), 404 for an
  unknown session or pod, 503 when the index store is unavailable.
"""


def _default_version() -> str:
    try:
        return package_version("kv-session-index")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0+unknown"


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
) -> FastAPI:
    """The REST app over `store`, which the caller opens before and closes after.

    `readiness` returns why the service is not ready (empty: ready); None means ready as
    soon as it serves. It is bounded by `readiness_timeout` seconds, so a hung dependency
    reads as "not ready" instead of hanging the kubelet's probe. `root_path` is for a
    reverse proxy that serves the app under a prefix. `tokens`: bearer tokens every `/v1`
    endpoint requires (none: open); the probes stay open, `/metrics` too unless
    `metrics_require_token`.
    """
    app = FastAPI(
        title=title,
        version=version or _default_version(),
        description=DESCRIPTION,
        root_path=root_path,
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.store = store
    app.state.reader = IndexReader(store)
    app.state.readiness = readiness
    app.state.readiness_timeout = readiness_timeout
    app.state.token_check = TokenCheck(tokens)
    install_error_handlers(app)
    # Documented in OpenAPI only where enforced, so the schema tells clients the truth.
    protected = [Depends(require_token)] if tokens else []
    unauthorized = UNAUTHORIZED if tokens else {}
    app.include_router(sessions.router, dependencies=protected, responses=unauthorized)
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
    _document_400_not_422(app)
    return app


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
