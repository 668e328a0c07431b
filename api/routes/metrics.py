"""`GET /metrics`: the process's Prometheus metrics, unauthenticated like the probes.

Imports prometheus_client only; the metrics themselves live beside their layers
(subscriber/metrics.py, api/metrics.py, kvsi/metrics.py).
"""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

router = APIRouter(tags=["health"])


@router.get("/metrics", response_class=Response, summary="Prometheus metrics")
async def metrics() -> Response:
    """Counters, gauges and histograms in the Prometheus text format."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
