"""Every Prometheus metric of the service, in one place.

Imports prometheus_client only, so the API and the subscriber can both use it.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

BATCHES = Counter(
    "kvsi_batches_total",
    "Batches received per worker, by what the store did with them.",
    ["worker", "outcome"],
)
BLOCK_EVENTS = Counter(
    "kvsi_block_events_total",
    "Block hashes applied (stored plus removed) per worker.",
    ["worker"],
)
DROPS = Counter(
    "kvsi_decode_drops_total",
    "Messages, batches or events skipped, by publisher and reason.",
    ["pod", "reason"],
)
GAPS = Counter(
    "kvsi_seq_gaps_total",
    "Seq jumps seen on the live stream per worker.",
    ["worker"],
)
BATCHES_MISSED = Counter(
    "kvsi_batches_missed_total",
    "Batches skipped over by seq jumps per worker (before any repair).",
    ["worker"],
)
LAST_SEQ = Gauge("kvsi_worker_last_seq", "Last seq received per worker.", ["worker"])
CONNECTED = Gauge(
    "kvsi_publisher_connected", "1 while the publisher's socket is connected.", ["pod"]
)
APPLY_SECONDS = Histogram(
    "kvsi_apply_seconds",
    "Time to apply one batch to the store.",
    buckets=(1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0),
)
