"""The wiring's Prometheus metrics: the index's size, the janitor, discovery, the loop lag,
the store's connection waits.

Imports prometheus_client only. Each layer keeps its own metrics beside its code
(subscriber/metrics.py for ingest, api/metrics.py for HTTP); these are the ones of the
processes that wire the layers together, so nothing below kvsi/ reaches up for a metric.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, Info
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

BUILD = Info(
    "kvsi_build",
    "What this process runs: the package version and the index core's build (`native`: "
    "compiled by mypyc; `interpreted`: built without a C compiler, same behaviour, lower "
    "ingest rate).",
)
LOOP_LAG = Histogram(
    "kvsi_event_loop_lag_seconds",
    "How late the event loop ran a timer due every LOOP_LAG_INTERVAL: what a request or a "
    "batch may wait behind other work (a long callback, a collection, the process "
    "descheduled on a busy node).",
    buckets=(1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
LOOP_LAG_INTERVAL = 0.25
"""Seconds between two samples of `LOOP_LAG`: four timers a second, nothing to measure."""
SESSIONS_EXPIRED = Counter(
    "kvsi_sessions_expired_total",
    "Sessions forgotten by the idle rule: left with no residency on any worker (their blocks "
    "stay in the workers' indexes).",
)
RESIDENCIES_EXPIRED = Counter(
    "kvsi_session_residencies_expired_total",
    "Session residencies (session, worker) dropped by the idle rule: no store of the session "
    "on that worker for session_idle_seconds, blocks held or not.",
)
DISCOVERY_PODS = Gauge(
    "kvsi_discovery_pods", "Running vLLM pods central mode currently subscribes to."
)
DISCOVERY_CHANGES = Counter(
    "kvsi_discovery_changes_total",
    "Central mode's worker changes: streams started, stopped, workers forgotten.",
    ["action"],
)
DISCOVERY_OWNED_PODS = Gauge(
    "kvsi_discovery_owned_pods",
    "Discovered pods this central replica follows: all of them, or with discovery.split its "
    "share (the replicas' values sum to kvsi_discovery_pods once they agree).",
)
DISCOVERY_REPLICAS = Gauge(
    "kvsi_discovery_replicas",
    "Live central replicas splitting the pods, as this replica's last beat saw them.",
)
DISCOVERY_BEAT_FAILURES = Counter(
    "kvsi_discovery_beat_failures_total",
    "Beats of this replica's roster record that failed (store down or slow): past "
    "discovery.replica_ttl_seconds of them the others take its pods.",
)
DISCOVERY_WATCH_RESTARTS = Counter(
    "kvsi_discovery_watch_restarts_total",
    "Kubernetes pod watches started again (after an error or an expired resource version).",
)


_LOSSES: tuple[tuple[str, str], ...] = (
    (
        "kvsi_index_sessions_hurt",
        "Sessions that lost blocks of the worker to eviction (or its cache emptying) since "
        "they last stored there.",
    ),
    (
        "kvsi_index_lost_blocks",
        "Blocks eviction took from the worker's sessions since each last stored there, "
        "summed over them (per hurt session: divide by kvsi_index_sessions_hurt).",
    ),
    (
        "kvsi_index_reprefill_tokens",
        "Prompt tokens the worker's sessions would prefill again there: their lost blocks x "
        "block size (sessions of unknown block size left out).",
    ),
)
"""(name, help) of the per-worker loss gauges, in `IndexSizes.update`'s `losses` order."""


class IndexSizes(Collector):
    """The index's size as the store last reported it: workers, and per worker its sessions
    and entries, and what eviction took from its sessions. Refreshed periodically
    (`kvsi.serve`), not per scrape: a scrape must not wait on the store. The families are
    built once per refresh (in a thread, `kvsi.serve.refresh_index_metrics`), so a scrape at
    fleet size (thousands of per-worker samples) only renders them; they are never changed
    once built (`api.routes.metrics` renders them in a thread), and `update` replaces them
    in one assignment."""

    def __init__(self) -> None:
        self._families: tuple[Metric, ...] = ()

    def update(
        self,
        workers: Iterable[tuple[str, int, int]],
        losses: Iterable[tuple[str, int, int, int]] = (),
    ) -> None:
        """Replace the snapshot with (worker, sessions, entries) per worker, and (worker,
        sessions hurt, lost blocks, re-prefill tokens) per worker."""
        self._families = _index_families(sorted(workers), sorted(losses))

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def _index_families(
    workers: list[tuple[str, int, int]], losses: list[tuple[str, int, int, int]]
) -> tuple[Metric, ...]:
    count = GaugeMetricFamily("kvsi_index_workers", "Workers in the index.")
    count.add_metric([], len(workers))
    sessions = GaugeMetricFamily(
        "kvsi_index_sessions",
        "Sessions with blocks on the worker (a session on two workers counts on each).",
        labels=["worker"],
    )
    entries = GaugeMetricFamily(
        "kvsi_index_entries", "Entries (cached blocks) of the worker.", labels=["worker"]
    )
    for worker, n_sessions, n_entries in workers:
        sessions.add_metric([worker], n_sessions)
        entries.add_metric([worker], n_entries)
    families = [GaugeMetricFamily(name, text, labels=["worker"]) for name, text in _LOSSES]
    for worker, *values in losses:
        for family, value in zip(families, values, strict=True):
            family.add_metric([worker], value)
    return (count, sessions, entries, *families)


INDEX = IndexSizes()
"""The index size gauges; `kvsi.serve` refreshes them from the store."""
REGISTRY.register(INDEX)


CONNECTION_WAITS_HELP = (
    "Redis client calls (commands, pipelines, script calls) of the store that found every "
    "connection of its pool in use (on Redis Cluster, its max_connections calls in flight) "
    "and waited for one; one that got a connection at once is not counted, one that waited "
    "too long fails as the store being unavailable. Redis stores only: a process on the "
    "memory store has no pool and exports neither series."
)
CONNECTION_WAIT_SECONDS_HELP = (
    "Seconds the calls counted by kvsi_store_connection_waits_total waited, summed (the mean "
    "wait: the ratio of the two rates). On a standalone server they run until the connection "
    "is in hand (a connection handed back closed is connected again within them); on a "
    "cluster, until the call has its place."
)


class StoreConnectionWaits(Collector):
    """The store's connection waits, read from the store at each scrape (two numbers it
    keeps as calls wait: no store I/O). Nothing until `follow` names a store that counts
    them; `kvsi.serve` does for a Redis store."""

    def __init__(self) -> None:
        self._read: Callable[[], tuple[int, float]] | None = None

    def follow(self, read: Callable[[], tuple[int, float]] | None) -> None:
        """Read the waits and their seconds from `read` at each scrape (None: export none)."""
        self._read = read

    def collect(self) -> Iterator[Metric]:
        read = self._read
        if read is not None:
            yield from _wait_families(*read())

    def describe(self) -> Iterator[Metric]:
        return _wait_families(0, 0.0)


def _wait_families(waits: int, seconds: float) -> Iterator[Metric]:
    yield CounterMetricFamily("kvsi_store_connection_waits", CONNECTION_WAITS_HELP, value=waits)
    yield CounterMetricFamily(
        "kvsi_store_connection_wait_seconds", CONNECTION_WAIT_SECONDS_HELP, value=seconds
    )


CONNECTION_WAITS = StoreConnectionWaits()
"""The store's connection waits; `kvsi.serve` points it at the store it opened."""
REGISTRY.register(CONNECTION_WAITS)


async def watch_loop_lag(interval: float = LOOP_LAG_INTERVAL) -> None:
    """Sample the event loop's lag into LOOP_LAG until cancelled: a stall that the request
    histograms spread over many routes shows here as one number per process."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        LOOP_LAG.observe(max(0.0, loop.time() - due))
