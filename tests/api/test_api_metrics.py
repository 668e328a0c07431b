"""api/metrics.py: the request series are exposed exactly as prometheus_client's own Counter
and Histogram expose the same updates (the `_created` times aside), and follow its switch
for the `_created` series."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import cast

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    enable_created_metrics,
    generate_latest,
)
from prometheus_client import metrics as prometheus_metrics

from kvsi.api.metrics import (
    BUCKETS,
    REQUESTS,
    REQUESTS_HELP,
    SECONDS,
    SECONDS_HELP,
    registered,
)

UPDATES = [
    ("GET", "/v1/sessions/{session_id}", 200, 0.00004),
    ("GET", "/v1/sessions/{session_id}", 200, 1e-4),
    ("GET", "/v1/sessions/{session_id}", 404, 0.00011),
    ("POST", "/v1/route", 200, 0.0025),
    ("POST", "/v1/route", 200, 0.75),
    ("POST", "/v1/route", 503, 2.5),
    ("POST", "/v1/route", 503, 3.0),
    ("GET", "unmatched", 404, 120.0),
    ("GET", "/v1/sessions/{session_id}", 200, 0.0),
    ("GET", "/v1/sessions/{session_id}", 200, -1.0),
    ("GET", "/v1/sessions/{session_id}", 500, float("inf")),
    ("GET", "/v1/sessions/{session_id}", 500, float("nan")),
]
CREATED = re.compile(rb"^(\S+_created\{.*\}) \S+$", re.MULTILINE)


def _theirs(updates: list[tuple[str, str, int, float]]) -> bytes:
    registry = CollectorRegistry()
    counter = Counter(REQUESTS, REQUESTS_HELP, ["method", "route", "status"], registry=registry)
    histogram = Histogram(
        SECONDS, SECONDS_HELP, ["method", "route"], buckets=BUCKETS, registry=registry
    )
    for method, route, status, seconds in updates:
        histogram.labels(method, route).observe(seconds)
        counter.labels(method, route, str(status)).inc()
    return generate_latest(registry)


def _ours(updates: list[tuple[str, str, int, float]]) -> bytes:
    registry = CollectorRegistry()
    series = registered(registry)
    for method, route, status, seconds in updates:
        series.timer(method, route).observe(seconds)
        series.count(method, route, status).inc()
    return generate_latest(registry)


@pytest.mark.parametrize("updates", [[], UPDATES[:1], UPDATES])
def test_the_exposition_is_prometheus_clients(updates: list[tuple[str, str, int, float]]) -> None:
    ours = _ours(updates)
    assert CREATED.sub(rb"\1 T", ours) == CREATED.sub(rb"\1 T", _theirs(updates))
    if updates:
        assert b'kvsi_http_request_seconds_bucket{le="+Inf"' in ours
        assert b"_created{" in ours


def _created_metrics(on: bool) -> None:
    """prometheus_client's switch for the `_created` series."""
    switch = enable_created_metrics if on else disable_created_metrics
    cast(Callable[[], None], switch)()


@pytest.mark.parametrize("created", [False, True])
def test_the_created_series_follow_prometheus_clients_switch(created: bool) -> None:
    before = prometheus_metrics._use_created
    try:
        _created_metrics(created)
        ours, theirs = _ours(UPDATES), _theirs(UPDATES)
    finally:
        _created_metrics(before)
    assert CREATED.sub(rb"\1 T", ours) == CREATED.sub(rb"\1 T", theirs)
    assert (b"_created" in ours) is created
