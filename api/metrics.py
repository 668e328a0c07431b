"""The API's own Prometheus metrics: requests by route template, never by raw path.

Imports prometheus_client only. Every request is counted and timed, so the two families
are kept by one collector of plain numbers (`RequestSeries`), exposed as prometheus_client's
own Counter and Histogram would expose them: the client's series take a lock per update and
walk the buckets in Python, which cost a request more than the count and the time are worth.
Updated and collected on the event loop's thread (`GET /metrics` is async), so unlocked.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Callable, Iterator
from typing import cast

from prometheus_client import REGISTRY, CollectorRegistry, Metric
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

REQUESTS = "kvsi_http_requests"
REQUESTS_HELP = "HTTP requests answered, by method, route template and status code."
SECONDS = "kvsi_http_request_seconds"
SECONDS_HELP = (
    "Time from a request's arrival to its response's first byte (the headers of an SSE "
    "stream), by method and route template."
)
BUCKETS = (1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_BOUNDS = (*BUCKETS, math.inf)
_go_float = cast(Callable[[float], str], floatToGoString)
_LE = tuple(_go_float(b) for b in _BOUNDS)
"""Each bound as the `le` label prometheus_client writes."""


class Timer:
    """One (method, route) series of the request-seconds histogram."""

    __slots__ = ("counts", "created", "total")

    def __init__(self) -> None:
        self.counts = [0] * len(_BOUNDS)
        self.total = 0.0
        self.created = time.time()

    def observe(self, seconds: float) -> None:
        """Count `seconds` in the first bucket whose bound is at least it (a NaN in none, as
        prometheus_client does; the sum takes it)."""
        if seconds <= math.inf:
            self.counts[bisect.bisect_left(_BOUNDS, seconds)] += 1
        self.total += seconds


class Count:
    """One (method, route, status) series of the request counter."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0
        self.created = time.time()

    def inc(self) -> None:
        self.value += 1


class RequestSeries(Collector):
    """Both families' series, by their labels, and their exposition. `REQUEST_SERIES` is the
    process's, registered once; the request paths that count (the middleware, the direct
    server) share it."""

    def __init__(self) -> None:
        self._timers: dict[tuple[str, str], Timer] = {}
        self._counts: dict[tuple[str, str, int], Count] = {}

    def timer(self, method: str, route: str) -> Timer:
        timer = self._timers.get((method, route))
        if timer is None:
            timer = self._timers[method, route] = Timer()
        return timer

    def count(self, method: str, route: str, status: int) -> Count:
        count = self._counts.get((method, route, status))
        if count is None:
            count = self._counts[method, route, status] = Count()
        return count

    def collect(self) -> Iterator[Metric]:
        created = _created_series()
        requests = Metric(REQUESTS, REQUESTS_HELP, "counter")
        for (method, route, status), count in list(self._counts.items()):
            labels = {"method": method, "route": route, "status": str(status)}
            requests.add_sample(f"{REQUESTS}_total", labels, float(count.value))
            if created:
                requests.add_sample(f"{REQUESTS}_created", labels, count.created)
        yield requests
        seconds = Metric(SECONDS, SECONDS_HELP, "histogram")
        for (method, route), timer in list(self._timers.items()):
            labels = {"method": method, "route": route}
            seen = 0
            for le, n in zip(_LE, timer.counts, strict=True):
                seen += n
                seconds.add_sample(f"{SECONDS}_bucket", {**labels, "le": le}, float(seen))
            seconds.add_sample(f"{SECONDS}_count", labels, float(seen))
            seconds.add_sample(f"{SECONDS}_sum", labels, timer.total)
            if created:
                seconds.add_sample(f"{SECONDS}_created", labels, timer.created)
        yield seconds


def _created_series() -> bool:
    """Whether the `_created` series are written: prometheus_client's own switch for its
    metrics (`PROMETHEUS_DISABLE_CREATED_SERIES` read at its import, then
    `disable_created_metrics()` / `enable_created_metrics()`), so every family agrees."""
    return bool(getattr(prometheus_metrics, "_use_created", True))


def registered(registry: CollectorRegistry = REGISTRY) -> RequestSeries:
    """A `RequestSeries` registered in `registry`."""
    series = RequestSeries()
    registry.register(series)
    return series


REQUEST_SERIES = registered()
