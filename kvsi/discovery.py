"""Central mode: the vLLM pods the Kubernetes API lists become workers, and leave after grace.

Imports the stream pool and store model; lightkube (the `k8s` extra) only inside the watch
adapter, so every other mode runs without it. Top to bottom: what a pod publishes
(`publishers_of`), the pure decision logic (`FleetPlanner`: pod events in, streams to start
and stop and workers to forget out; `Assignment`: of those, what this replica follows when
several split the pods), the Kubernetes list+watch adapter (`watch_pods`), and the loop that
joins them to a running `StreamPool` (`run_discovery`), beating the replicas' roster.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import structlog

from kvsi import metrics
from kvsi.errors import StartupError
from kvsi.ownership import owner
from kvsi.replicas import ReplicaBeat
from kvsi.settings import DiscoveryConfig
from kvsi.store.model import WorkerKey, WorkerState, WorkerStatus
from kvsi.subscriber import metrics as ingest_metrics
from kvsi.subscriber.pool import StreamPool
from kvsi.subscriber.stream import PublisherSpec

if TYPE_CHECKING:
    from lightkube import AsyncClient
    from lightkube.core.client import LabelSelector
    from lightkube.resources.core_v1 import Pod

    from kvsi.store.base import ReplicaRoster

log = structlog.get_logger(__name__)

ANNOTATION = "kv-session-index/"
"""Prefix of the pod annotations that override DiscoveryConfig's ports and DP size."""

EVENT_QUEUE = 1_000
"""Pod events held between the watch and the planner: the watch waits when it is full (the
API server buffers), so a slow store cannot make this grow."""

RETRY_FIRST_SECONDS = 0.5
RETRY_MAX_SECONDS = 30.0
"""Back-off between failed list+watch attempts: an API server outage must not be hammered."""


@dataclass(frozen=True)
class PodInfo:
    """What discovery needs of a pod."""

    name: str
    ip: str | None
    running: bool
    annotations: dict[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class PodEvent:
    """One watch event."""

    kind: Literal["ADDED", "MODIFIED", "DELETED"]
    pod: PodInfo


@dataclass(frozen=True)
class PodSnapshot:
    """A full listing (at start, and after every watch restart): pods not in it are gone."""

    pods: tuple[PodInfo, ...]


@dataclass(frozen=True)
class Changes:
    """What to do to the pool, in this order: stop, forget, start."""

    start: tuple[PublisherSpec, ...] = ()
    stop: tuple[WorkerKey, ...] = ()
    """Streams to stop: the pod is gone, or a worker's endpoint changed (then it is in
    `start` again, with the new endpoint)."""
    forget: tuple[WorkerKey, ...] = ()
    """Workers gone for longer than the grace time: remove them with their data."""
    release: tuple[WorkerKey, ...] = ()
    """Streams to stop because another replica follows the pod now: its worker is not
    marked gone (the new owner's stream reports it)."""

    @staticmethod
    def merge(parts: Iterable[Changes]) -> Changes:
        parts = list(parts)
        return Changes(
            start=tuple(s for p in parts for s in p.start),
            stop=tuple(k for p in parts for k in p.stop),
            forget=tuple(k for p in parts for k in p.forget),
            release=tuple(k for p in parts for k in p.release),
        )


def _key(spec: PublisherSpec) -> WorkerKey:
    return WorkerKey(spec.pod, spec.dp_rank)


def publishers_of(pod: PodInfo, config: DiscoveryConfig, topic: str) -> tuple[PublisherSpec, ...]:
    """One publisher per DP rank of a running pod with an IP (none otherwise); vLLM offsets
    both ports by the rank. Raises ValueError for an unusable annotation."""
    if not pod.running or not pod.ip:
        return ()
    events = _annotated_port(pod, "events-port", config.events_port)
    replay = _annotated_port(pod, "replay-port", config.replay_port)
    dp_size = int(pod.annotations.get(ANNOTATION + "dp-size", config.dp_size))
    if events is None or not 1 <= dp_size <= 256:
        raise ValueError(f"pod {pod.name}: needs an events port and a dp-size in 1..256")
    host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
    return tuple(
        PublisherSpec(
            pod=pod.name,
            endpoint=f"tcp://{host}:{events + rank}",
            replay_endpoint=None if replay is None else f"tcp://{host}:{replay + rank}",
            dp_rank=rank,
            topic=topic,
        )
        for rank in range(dp_size)
    )


def _annotated_port(pod: PodInfo, name: str, default: int | None) -> int | None:
    value = pod.annotations.get(ANNOTATION + name)
    if value is None:
        return default
    if value.strip().lower() in ("", "none"):
        return None
    port = int(value)
    if not 1 <= port <= 65535:
        raise ValueError(f"pod {pod.name}: annotation {ANNOTATION}{name}={value!r} is no port")
    return port


class FleetPlanner:
    """The decision logic, pure: pod events and the clock in, `Changes` out.

    A worker's stream runs while its pod runs. When the pod goes (deleted, missing from a
    listing, or no longer Running) the stream stops at once (its IP may soon belong to
    another pod) and the worker is forgotten `grace_seconds` later, unless the pod returns
    under the same name first (a StatefulSet pod, a node that comes back).
    """

    def __init__(self, config: DiscoveryConfig, topic: str = "") -> None:
        self._config = config
        self._topic = topic
        self.running: dict[str, tuple[PublisherSpec, ...]] = {}
        """Pods subscribed to, with their publishers."""
        self.gone: dict[WorkerKey, float] = {}
        """Stopped workers not forgotten yet, with when their pod went."""

    def observe(self, event: PodEvent | PodSnapshot, now: float) -> Changes:
        """What one watch event, or a full listing, calls for."""
        if isinstance(event, PodSnapshot):
            listed = {pod.name for pod in event.pods}
            left = [self._left(name, now) for name in list(self.running) if name not in listed]
            return Changes.merge([*left, *(self._seen(pod, now) for pod in event.pods)])
        if event.kind == "DELETED":
            return self._left(event.pod.name, now)
        return self._seen(event.pod, now)

    def expire(self, now: float) -> Changes:
        """Forget the workers gone for at least the grace time."""
        due = [k for k, since in self.gone.items() if since + self._config.grace_seconds <= now]
        for key in due:
            del self.gone[key]
        return Changes(forget=tuple(due))

    def wait_seconds(self, now: float) -> float | None:
        """Until the next worker is due to be forgotten; None: none is."""
        if not self.gone:
            return None
        return max(0.0, min(self.gone.values()) + self._config.grace_seconds - now)

    def _seen(self, pod: PodInfo, now: float) -> Changes:
        try:
            specs = publishers_of(pod, self._config, self._topic)
        except ValueError as exc:
            log.warning("discovery.pod_skipped", pod=pod.name, reason=str(exc))
            specs = ()
        if not specs:
            return self._left(pod.name, now)
        old = self.running.get(pod.name, ())
        self.running[pod.name] = specs
        keys = {_key(s) for s in specs}
        for key in keys:
            self.gone.pop(key, None)
        stop = tuple(_key(s) for s in old if s not in specs)
        for key in stop:
            if key not in keys:  # a rank the pod no longer has
                self.gone[key] = now
        return Changes(start=tuple(s for s in specs if s not in old), stop=stop)

    def _left(self, name: str, now: float) -> Changes:
        old = self.running.pop(name, ())
        for spec in old:
            self.gone[_key(spec)] = now
        return Changes(stop=tuple(_key(s) for s in old))


class Assignment:
    """Of the planner's changes, what this replica does when replicas split the pods, pure:
    the planner's `Changes` and views of the live replicas in, this replica's `Changes` out.

    A pod is followed by its owner among the live replicas (`kvsi.ownership.owner`): a
    replica starts the pods it gains at once and releases those it loses at once, so a
    handover overlaps (the fence makes a double apply harmless) rather than leaves a gap,
    as long as the replicas' views agree; while they differ (a beat apart), a pod may have
    two followers, or none until the next beat (the new owner's stream replays from the
    stored fence). Only the owner forgets a gone pod's workers. Without splitting, the view
    is this replica alone: it follows every pod.
    """

    def __init__(self, me: str, *, split: bool) -> None:
        self.me = me
        self.replicas: tuple[str, ...] = () if split else (me,)
        """The live replicas as last seen; none before a splitting replica's first beat."""
        self.following: dict[WorkerKey, PublisherSpec] = {}
        """The streams this replica runs."""

    def mine(self, pod: str) -> bool:
        return owner(pod, self.replicas) == self.me

    def owned_pods(self) -> int:
        return len({key.pod for key in self.following})

    def on_fleet(self, changes: Changes) -> Changes:
        """The planner's changes, kept to the pods this replica owns."""
        stop = tuple(k for k in changes.stop if self.following.pop(k, None) is not None)
        start = tuple(s for s in changes.start if self.mine(s.pod))
        self.following.update((_key(s), s) for s in start)
        forget = tuple(k for k in changes.forget if self.mine(k.pod))
        return Changes(start=start, stop=stop, forget=forget)

    def on_view(
        self, replicas: tuple[str, ...], running: dict[str, tuple[PublisherSpec, ...]]
    ) -> Changes:
        """A new view of the live replicas: start the running pods gained, release those lost."""
        self.replicas = replicas
        wanted = {_key(s): s for pod, specs in running.items() if self.mine(pod) for s in specs}
        release = tuple(k for k in self.following if k not in wanted)
        start = tuple(s for k, s in wanted.items() if k not in self.following)
        for key in release:
            del self.following[key]
        self.following.update((_key(s), s) for s in start)
        return Changes(start=start, release=release)


# -- the Kubernetes adapter ---------------------------------------------------------------


def open_kube_client(config: DiscoveryConfig) -> AsyncClient:
    """A client configured like kubectl would be: in a cluster, the pod's service account;
    elsewhere KUBECONFIG or ~/.kube/config. A StartupError if lightkube or a configuration
    is missing, so a misconfigured central mode fails at start with one line."""
    try:
        from lightkube import AsyncClient
        from lightkube.core.exceptions import ConfigError
    except ImportError as exc:
        raise StartupError(
            f"--discover needs the Kubernetes client ({exc}): pip install 'kv-session-index[k8s]'"
        ) from exc
    try:
        return AsyncClient(namespace=config.namespace)
    except ConfigError as exc:
        raise StartupError(
            f"--discover needs a Kubernetes configuration: {exc} (in a cluster, the pod's "
            "service account; elsewhere KUBECONFIG or ~/.kube/config)"
        ) from exc


def pod_info(pod: Pod) -> PodInfo:
    """The parts of a lightkube Pod discovery uses."""
    meta, status = pod.metadata, pod.status
    return PodInfo(
        name=meta.name if meta is not None and meta.name else "",
        ip=status.podIP if status is not None else None,
        running=status is not None and status.phase == "Running",
        annotations=dict(meta.annotations or {}) if meta is not None else {},
    )


async def watch_pods(
    client: AsyncClient, config: DiscoveryConfig
) -> AsyncGenerator[PodSnapshot | PodEvent, None]:
    """List, then watch from the listing's version; on any error (an expired version
    included) back off and list again. Never ends; a snapshot follows every restart, so
    pods deleted while the watch was down are noticed."""
    from lightkube.resources.core_v1 import Pod

    pause = RETRY_FIRST_SECONDS
    labels: LabelSelector = dict(config.labels)
    while True:
        try:
            listing = client.list(Pod, namespace=config.namespace, labels=labels)
            yield PodSnapshot(tuple([pod_info(p) async for p in listing]))
            pause = RETRY_FIRST_SECONDS
            watch = client.watch(
                Pod,
                namespace=config.namespace,
                labels=labels,
                resource_version=listing.resourceVersion,
            )
            async for kind, pod in watch:
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    yield PodEvent(kind, pod_info(pod))  # type: ignore[arg-type]
        except Exception as exc:  # any failure: list again after a pause, never give up
            metrics.DISCOVERY_WATCH_RESTARTS.inc()
            log.warning("discovery.watch_failed", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(pause)
            pause = min(pause * 2, RETRY_MAX_SECONDS)


# -- the loop -----------------------------------------------------------------------------


async def run_discovery(
    config: DiscoveryConfig,
    pool: StreamPool,
    source: AsyncIterator[PodSnapshot | PodEvent],
    *,
    topic: str = "",
    roster: ReplicaRoster | None = None,
) -> None:
    """Apply `source`'s pod events and the grace timer to `pool` until cancelled; with a
    `roster` (discovery.split), only to the pods this replica owns, beating the roster in
    the same loop (a beat is bounded so that it lands within the record it renews) and
    leaving it when cancelled."""
    planner = FleetPlanner(config, topic)
    assignment = Assignment(config.replica_id, split=roster is not None)
    beat = (
        None
        if roster is None
        else ReplicaBeat(roster, config.replica_id, config.beat_seconds, config.replica_ttl_seconds)
    )
    events: asyncio.Queue[PodSnapshot | PodEvent] = asyncio.Queue(maxsize=EVENT_QUEUE)
    pump = asyncio.create_task(_pump(source, events), name="discovery-watch")
    try:
        while True:
            if beat is not None:
                view = await beat.beat_if_due(time.monotonic())
                if view is not None:
                    changes = assignment.on_view(view, planner.running)
                    await _apply(changes, assignment, pool, config, beat.epoch)
                else:
                    _fence_at(pool, beat.epoch)
            await _apply(
                assignment.on_fleet(planner.expire(time.monotonic())), assignment, pool, config
            )
            try:
                async with asyncio.timeout(_wait(planner, beat)):
                    event = await events.get()
            except TimeoutError:
                continue
            changes = assignment.on_fleet(planner.observe(event, time.monotonic()))
            await _apply(changes, assignment, pool, config)
            metrics.DISCOVERY_PODS.set(len(planner.running))
    finally:
        pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)
        if beat is not None:
            await beat.leave()


def _wait(planner: FleetPlanner, beat: ReplicaBeat | None) -> float | None:
    """Until a worker is due to be forgotten or a beat is due; None: neither ever is."""
    now = time.monotonic()
    wait = planner.wait_seconds(now)
    if beat is None:
        return wait
    due = beat.wait_seconds(now)
    return due if wait is None else min(wait, due)


async def _apply(
    changes: Changes,
    assignment: Assignment,
    pool: StreamPool,
    config: DiscoveryConfig,
    epoch: int | None = None,
) -> None:
    await apply_changes(changes, pool, config, epoch)
    metrics.DISCOVERY_OWNED_PODS.set(assignment.owned_pods())


def _fence_at(pool: StreamPool, epoch: int | None) -> None:
    """Fence the statuses stored from now on at the roster's `epoch`; on a new one, every
    kept stream stores its status again: a replica that owned one of its workers between
    this replica's two views (joined and left between two beats) may have stored its own,
    at an epoch the new one does not refuse."""
    if epoch != pool.gate.status_epoch:
        pool.gate.status_epoch = epoch
        pool.restatus()


async def _pump(
    source: AsyncIterator[PodSnapshot | PodEvent], events: asyncio.Queue[PodSnapshot | PodEvent]
) -> None:
    async for event in source:
        await events.put(event)


async def apply_changes(
    changes: Changes, pool: StreamPool, config: DiscoveryConfig, epoch: int | None = None
) -> None:
    """Stop, release, forget, start. A stopped worker not started again is shown
    `disconnected` while it waits out the grace time, so routers stop choosing it at once;
    a released one is not (another replica follows it). `epoch`: the roster epoch of the
    view these changes follow, fencing the statuses written from then on; taken after the
    releases, so a stream released here writes none at it over the new owner's."""
    restarted = {_key(s) for s in changes.start}
    for key in changes.stop:
        await pool.remove(key.pod, key.dp_rank)
        metrics.DISCOVERY_CHANGES.labels("stopped").inc()
        if key not in restarted:
            await _mark_gone(pool, key, config.grace_seconds)
        log.info(
            "discovery.worker_stopped", worker=str(key), pod=key.pod, replaced=key in restarted
        )
    for key in changes.release:
        await pool.remove(key.pod, key.dp_rank)
        await pool.gate.release(key)
        ingest_metrics.INGEST.forget(str(key))
        metrics.DISCOVERY_CHANGES.labels("released").inc()
        log.info("discovery.worker_released", worker=str(key), pod=key.pod)
    for key in changes.forget:
        await pool.gate.remove_worker(key)
        ingest_metrics.INGEST.forget(str(key))
        metrics.DISCOVERY_CHANGES.labels("forgotten").inc()
        log.info("discovery.worker_forgotten", worker=str(key), pod=key.pod)
    if epoch is not None:
        _fence_at(pool, epoch)
    for spec in changes.start:
        await pool.add(spec)
        metrics.DISCOVERY_CHANGES.labels("started").inc()
        log.info(
            "discovery.worker_started",
            worker=str(_key(spec)),
            pod=spec.pod,
            endpoint=spec.endpoint,
            replay_endpoint=spec.replay_endpoint,
        )


async def _mark_gone(pool: StreamPool, key: WorkerKey, grace: float) -> None:
    status = WorkerStatus(
        state=WorkerState.DISCONNECTED,
        since=time.time(),
        detail=f"pod gone from the Kubernetes API; forgotten after {grace:g}s unless it returns",
    )
    await pool.gate.publish_status(lambda: (key, status))
