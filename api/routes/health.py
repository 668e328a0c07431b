"""Health: liveness (/healthz) and readiness (/readyz) probes for Kubernetes.

Imports neither zmq nor subscriber/. Readiness is a callable the caller injects (for
example: subscribers connected, store reachable), so this module knows no component.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from kvsi.api.schemas import Health, Readiness

log = structlog.get_logger(__name__)

ReadinessCheck = Callable[[], Awaitable[list[str]]]
"""Returns why the service is not ready; an empty list means ready."""

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> Health:
    """The process is up and serving HTTP.

    Touches nothing else: a store outage must not get the pod restarted (that would not
    fix Redis, and would drop the in-memory index).
    """
    return Health()


@router.get(
    "/readyz",
    response_model=Readiness,
    response_model_exclude_none=True,
    responses={503: {"model": Readiness, "description": "Not ready; `reasons` says why."}},
)
async def readyz(request: Request) -> Readiness | JSONResponse:
    """Ready to answer queries: 200, or 503 with the reasons.

    A check that raises or exceeds its timeout counts as not ready, with the reason.
    """
    check: ReadinessCheck | None = request.app.state.readiness
    timeout: float = request.app.state.readiness_timeout
    reasons: list[str] = []
    if check is not None:
        try:
            async with asyncio.timeout(timeout):
                reasons = list(await check())
        except TimeoutError:
            reasons = [f"readiness check timed out after {timeout:g}s"]
        except Exception as exc:
            log.warning("readiness.check_failed", error=f"{type(exc).__name__}: {exc}")
            reasons = [f"readiness check failed: {type(exc).__name__}: {exc}"]
    if reasons:
        body = Readiness(status="not ready", reasons=reasons)
        return JSONResponse(status_code=503, content=body.model_dump())
    return Readiness(status="ready")
