"""The API's own Prometheus metrics: requests by route template, never by raw path.

Imports prometheus_client only.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

HTTP_REQUESTS = Counter(
    "kvsi_http_requests_total",
    "HTTP requests answered, by method, route template and status code.",
    ["method", "route", "status"],
)
HTTP_SECONDS = Histogram(
    "kvsi_http_request_seconds",
    "Time from a request's arrival to its response's first byte (the headers of an SSE "
    "stream), by method and route template.",
    ["method", "route"],
    buckets=(1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)


class RequestSeries:
    """The labelled series of `HTTP_SECONDS` and `HTTP_REQUESTS`, kept: `labels()` takes a
    lock and formats the values per call."""

    def __init__(self) -> None:
        self._timers: dict[tuple[str, str], Histogram] = {}
        self._counts: dict[tuple[str, str, int], Counter] = {}

    def timer(self, method: str, route: str) -> Histogram:
        timer = self._timers.get((method, route))
        if timer is None:
            timer = self._timers[method, route] = HTTP_SECONDS.labels(method, route)
        return timer

    def count(self, method: str, route: str, status: int) -> Counter:
        count = self._counts.get((method, route, status))
        if count is None:
            count = self._counts[method, route, status] = HTTP_REQUESTS.labels(
                method, route, str(status)
            )
        return count
