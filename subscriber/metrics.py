"""Ingest's Prometheus metrics: per-worker counters on the hot path, families at scrape time.

Imports prometheus_client only. Per-worker ingest numbers are plain attributes on the hot
path (`WorkerCounters`, one per stream), turned into metric families only when /metrics is
scraped (`INGEST`), each with a fleet total beside it: a stream pays an integer add per
batch, not a labelled-metric lookup.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from typing import Protocol

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

APPLY_SECONDS = Histogram(
    "kvsi_apply_seconds",
    "Time to apply one batch to the store.",
    buckets=(1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0),
)
INDEX_DELAY_SECONDS = Histogram(
    "kvsi_index_delay_seconds",
    "From a live batch's engine time (its ts) to its apply: how far the index trails the "
    "engines, the publisher's queue, the network and the wait before the apply included. "
    "The engine's clock against this process's: skew between hosts adds to it (a negative "
    "difference counts as 0). Replayed batches are left out (their age is how long the "
    "publisher buffered them).",
    buckets=(1e-3, 2.5e-3, 5e-3, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
REPLAY_SECONDS = Histogram(
    "kvsi_replay_seconds",
    "Time of one replay, from the request to the end marker (or the last failed attempt), "
    "applying the replayed batches included.",
    buckets=(1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
STORE_AVAILABLE = Gauge(
    "kvsi_store_available", "1 while the index store answers ingest's calls, 0 during an outage."
)
STORE_ERRORS = Counter(
    "kvsi_store_errors_total",
    "Ingest's failed index store calls (each retry counts), by store operation.",
    ["operation"],
)
STATUSES_REFUSED = Counter(
    "kvsi_statuses_refused_total",
    "Worker statuses the store refused as fenced at an older roster epoch than the one it "
    "holds (central replicas, discovery.split): another replica owns the worker at a newer "
    "view. Rising steadily on one replica: its roster epoch lags (its beats failing).",
)


@dataclass(slots=True)
class WorkerCounters:
    """One worker's ingest numbers; counters only grow, gauges are refreshed when read."""

    worker: str
    messages: int = 0
    block_events: int = 0
    gaps: int = 0
    batches_missed: int = 0
    batches_replayed: int = 0
    restarts: int = 0
    batches_lost: int = 0
    queue_overflow: int = 0
    unconfirmed_dropped: int = 0
    index_lost: int = 0
    batches: dict[str, int] = field(default_factory=dict)
    drops: dict[str, int] = field(default_factory=dict)
    replays: dict[str, int] = field(default_factory=dict)
    replay_failures: dict[str, int] = field(default_factory=dict)
    resource_failures: dict[str, int] = field(default_factory=dict)
    last_seq: int | None = None
    applied_seq: int | None = None
    lag_batches: int = 0
    lag_seconds: float = 0.0
    queued: int = 0
    connected: bool = False
    degraded: bool = False


_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("messages", "kvsi_messages", "Live messages received."),
    ("block_events", "kvsi_block_events", "Block hashes applied (stored plus removed)."),
    ("gaps", "kvsi_seq_gaps", "Seq jumps seen (live, or a replay that starts late)."),
    ("batches_missed", "kvsi_batches_missed", "Batches skipped over by seq jumps, before repair."),
    ("batches_replayed", "kvsi_batches_replayed", "Batches applied from replay replies."),
    ("restarts", "kvsi_engine_restarts", "Engine restarts detected (seq back, newer time)."),
    ("batches_lost", "kvsi_batches_lost", "Batches missed that replay could not repair."),
    ("queue_overflow", "kvsi_queue_overflow", "Live messages dropped by a full ingest queue."),
    (
        "index_lost",
        "kvsi_index_lost",
        "Times the index store was found without this worker's index (rebuilt by replay).",
    ),
    (
        "unconfirmed_dropped",
        "kvsi_unconfirmed_dropped",
        "Entries dropped by the stale policy (not reconfirmed after an unrepaired gap).",
    ),
)
"""(attribute, metric name, help) of the unlabelled per-worker counters."""

_LABELLED: tuple[tuple[str, str, str, str], ...] = (
    ("batches", "kvsi_batches", "outcome", "Batches by outcome (applied, duplicate, ...)."),
    ("drops", "kvsi_decode_drops", "reason", "Messages, batches or events skipped, by reason."),
    ("replays", "kvsi_replays", "result", "Replays by result (complete, stopped, failed)."),
    ("replay_failures", "kvsi_replay_failures", "reason", "Failed replays, by reason."),
    (
        "resource_failures",
        "kvsi_resource_failures",
        "reason",
        "Times a resource limit (the process's room for streams, sockets, file descriptors, "
        "memory) kept the worker's stream from opening a socket, by reason; once per episode, "
        "its retries not counted.",
    ),
)
"""(attribute, metric name, label, help) of the per-worker counters with a second label."""

_COUNTER_FIELDS = frozenset(
    [name for name, _, _ in _COUNTERS] + [name for name, _, _, _ in _LABELLED]
)


class IngestSource(Protocol):
    """Something that owns WorkerCounters: a stream."""

    def read_counters(self) -> WorkerCounters:
        """The counters with their gauges brought up to date."""
        ...


class IngestCollector(Collector):
    """Per-worker ingest metrics and their fleet totals, read from the live streams.

    A stopped stream's counters are kept (folded per worker), so counters never go back
    when a pool is restarted inside one process.
    """

    def __init__(self) -> None:
        self._sources: list[IngestSource] = []
        self._retired: dict[str, WorkerCounters] = {}
        self._forgotten = WorkerCounters("")

    def track(self, source: IngestSource) -> None:
        self._sources.append(source)

    def untrack(self, source: IngestSource) -> None:
        if source in self._sources:
            self._sources.remove(source)
            counters = source.read_counters()
            kept = self._retired.setdefault(counters.worker, WorkerCounters(counters.worker))
            _add_counters(kept, counters)

    def forget(self, worker: str) -> None:
        """Drop a removed worker's series: central mode's pods come and go under new names,
        and their series must not pile up. Its counts stay in the fleet totals, so those
        never go back."""
        retired = self._retired.pop(worker, None)
        if retired is not None:
            _add_counters(self._forgotten, retired)

    def workers(self) -> dict[str, WorkerCounters]:
        """Per worker: counters of live and stopped streams summed, gauges of live ones."""
        merged: dict[str, WorkerCounters] = {}
        for worker, retired in self._retired.items():
            _add_counters(merged.setdefault(worker, WorkerCounters(worker)), retired)
        for source in self._sources:
            counters = source.read_counters()
            into = merged.setdefault(counters.worker, WorkerCounters(counters.worker))
            _add_counters(into, counters)
            _max_gauges(into, counters)
        return merged

    def collect(self) -> Iterator[Metric]:
        workers = sorted(self.workers().values(), key=lambda c: c.worker)
        yield from _counter_families(workers, self._forgotten)
        yield from _gauge_families(workers)


def _add_counters(into: WorkerCounters, more: WorkerCounters) -> None:
    for f in fields(WorkerCounters):
        if f.name not in _COUNTER_FIELDS:
            continue
        value = getattr(more, f.name)
        if isinstance(value, dict):
            target: dict[str, int] = getattr(into, f.name)
            for key, n in value.items():
                target[str(key)] = target.get(str(key), 0) + n
        else:
            setattr(into, f.name, getattr(into, f.name) + value)


def _max_gauges(into: WorkerCounters, more: WorkerCounters) -> None:
    for name in ("last_seq", "applied_seq"):
        mine, theirs = getattr(into, name), getattr(more, name)
        if theirs is not None and (mine is None or theirs > mine):
            setattr(into, name, theirs)
    into.lag_batches = max(into.lag_batches, more.lag_batches)
    into.lag_seconds = max(into.lag_seconds, more.lag_seconds)
    into.queued += more.queued
    into.connected = into.connected or more.connected
    into.degraded = into.degraded or more.degraded


def _counter_families(
    workers: Iterable[WorkerCounters], forgotten: WorkerCounters
) -> Iterator[Metric]:
    """Per-worker counters, and fleet totals that include the forgotten workers' counts."""
    workers = list(workers)
    for attr, name, text in _COUNTERS:
        per = CounterMetricFamily(name, f"{text} Per worker.", labels=["worker"])
        total = CounterMetricFamily(name.replace("kvsi_", "kvsi_fleet_", 1), f"{text} All workers.")
        for c in workers:
            per.add_metric([c.worker], getattr(c, attr))
        total.add_metric([], sum(getattr(c, attr) for c in [*workers, forgotten]))
        yield per
        yield total
    for attr, name, label, text in _LABELLED:
        per = CounterMetricFamily(name, f"{text} Per worker.", labels=["worker", label])
        total = CounterMetricFamily(
            name.replace("kvsi_", "kvsi_fleet_", 1), f"{text} All workers.", labels=[label]
        )
        sums: dict[str, int] = dict(getattr(forgotten, attr))
        for c in workers:
            for key, n in sorted(getattr(c, attr).items()):
                per.add_metric([c.worker, key], n)
                sums[key] = sums.get(key, 0) + n
        for key, n in sorted(sums.items()):
            total.add_metric([key], n)
        yield per
        yield total


def _gauge_families(workers: list[WorkerCounters]) -> Iterator[Metric]:
    last = GaugeMetricFamily("kvsi_worker_last_seq", "Newest seq received.", labels=["worker"])
    applied = GaugeMetricFamily(
        "kvsi_worker_applied_seq", "Seq of the last batch applied.", labels=["worker"]
    )
    lag = GaugeMetricFamily(
        "kvsi_worker_lag_batches", "Newest seq received minus seq applied.", labels=["worker"]
    )
    age = GaugeMetricFamily(
        "kvsi_worker_lag_seconds", "Age of the oldest batch not yet applied.", labels=["worker"]
    )
    queued = GaugeMetricFamily(
        "kvsi_worker_queued",
        "Live messages received and not applied yet (in the ingest queue or being applied).",
        labels=["worker"],
    )
    connected = GaugeMetricFamily(
        "kvsi_publisher_connected",
        "1 while the publisher's socket is connected.",
        labels=["worker"],
    )
    degraded = GaugeMetricFamily(
        "kvsi_worker_degraded", "1 while the worker's index is not exact.", labels=["worker"]
    )
    for c in workers:
        if c.last_seq is not None:
            last.add_metric([c.worker], c.last_seq)
        if c.applied_seq is not None:
            applied.add_metric([c.worker], c.applied_seq)
        lag.add_metric([c.worker], c.lag_batches)
        age.add_metric([c.worker], c.lag_seconds)
        queued.add_metric([c.worker], c.queued)
        connected.add_metric([c.worker], 1 if c.connected else 0)
        degraded.add_metric([c.worker], 1 if c.degraded else 0)
    yield from (last, applied, lag, age, queued, connected, degraded)
    totals = (
        ("kvsi_fleet_workers", "Workers ingested.", len(workers)),
        (
            "kvsi_fleet_workers_connected",
            "Workers whose publisher is connected.",
            sum(c.connected for c in workers),
        ),
        (
            "kvsi_fleet_workers_degraded",
            "Workers whose index is not exact.",
            sum(c.degraded for c in workers),
        ),
        (
            "kvsi_fleet_lag_batches_max",
            "Largest lag in batches over all workers.",
            max((c.lag_batches for c in workers), default=0),
        ),
        (
            "kvsi_fleet_lag_seconds_max",
            "Largest lag in seconds over all workers.",
            max((c.lag_seconds for c in workers), default=0.0),
        ),
    )
    for name, text, value in totals:
        family = GaugeMetricFamily(name, text)
        family.add_metric([], value)
        yield family


INGEST = IngestCollector()
"""The process's ingest metrics; streams register themselves while they run."""
REGISTRY.register(INGEST)
