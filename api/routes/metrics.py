"""`GET /metrics`: the process's Prometheus metrics, unauthenticated like the probes.

Imports prometheus_client only; the metrics themselves live beside their layers
(subscriber/metrics.py, api/metrics.py, kvsi/metrics.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

router = APIRouter(tags=["health"])


class Collected(Collector):
    """What the registry's collectors gave at one moment, to render apart from them."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


@router.get("/metrics", response_class=Response, summary="Prometheus metrics")
async def metrics() -> Response:
    """Counters, gauges and histograms in the Prometheus text format.

    Collected on the event loop (collectors read the streams' and the server's state, which
    the loop changes), rendered in a thread: at fleet size the text is thousands of
    per-worker samples, whose rendering held the loop, and every request waiting on it
    (bench/README.md, fleet_latency.py, session 25).
    """
    collected = Collected(list(REGISTRY.collect()))
    text = await asyncio.to_thread(generate_latest, collected)
    return Response(text, media_type=CONTENT_TYPE_LATEST)
