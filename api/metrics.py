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
