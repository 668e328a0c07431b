"""A fleet of simulated vLLM pods: engines plus publishers on loopback, driven by a workload.

Imports nothing from store/, api/ or kvsi/: a service under test only ever sees its sockets.
Its ZMQ context is sized like the subscriber's, by subscriber/sockets.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

import structlog
import zmq
import zmq.asyncio

from kvsi.simulator.engine import SimulatedEngine
from kvsi.simulator.publisher import DEFAULT_BUFFER_STEPS, SimulatedPublisher
from kvsi.simulator.workload import AgenticWorkload, Request
from kvsi.subscriber.sockets import FILES_KEPT, sized_context
from kvsi.subscriber.wire import KVCacheEvent

log = structlog.stdlib.get_logger(__name__)

_AUTO_PORT_ATTEMPTS = 50
"""Random port ranges tried per pod before giving up (only when several DP ranks need a run)."""

_PORT_RNG = random.Random()
"""Port choice must not consume the seeded RNG: the workload stays the same either way."""

SOCKETS_PER_WORKER = 2
"""A worker's PUB and replay ROUTER."""

FILES_PER_WORKER = 6
"""Descriptors per worker: its two sockets' mailboxes and listeners, and the connections of
one subscriber and one replay."""

_MAX_CATCH_UP_TICKS = 64
"""Ticks run back to back when late, before yielding, so a fast rate cannot starve the loop."""

_TIMER_SLACK = 0.001
"""Added to each wait for the next tick: uvloop's clock and timers count whole milliseconds
(a timer may fire up to one early), so a wait of exactly the gap would wake before the tick
is due and spin on shorter and shorter waits until it is."""


def pod_names(count: int) -> list[str]:
    """pod-a, pod-b, ..., pod-z, pod-ba, ... (letters, so names never look like ranks)."""
    names = []
    for index in range(count):
        letters = ""
        n = index
        while True:
            n, rem = divmod(n, 26)
            letters = string.ascii_lowercase[rem] + letters
            if n == 0:
                break
        names.append(f"pod-{letters}")
    return names


@dataclass(frozen=True, slots=True)
class WorkerEndpoints:
    """Where one worker (pod, DP rank) publishes: vLLM puts rank r at the pod's port + r."""

    pod: str
    dp_rank: int
    endpoint: str
    replay_endpoint: str


@dataclass(slots=True)
class FleetStats:
    """What a run produced, for logs and benchmark reports."""

    ticks: int = 0
    batches: int = 0
    requests: int = 0
    events: int = 0
    seconds: float = 0.0


@dataclass(slots=True)
class _Worker:
    pod: str
    dp_rank: int
    engine: SimulatedEngine
    publisher: SimulatedPublisher


class SimulatedFleet:
    """Pods of simulated vLLM workers, sessions routed to them sticky, sometimes migrating.

    Each worker (pod, DP rank) is an engine and a publisher with a replay endpoint. `run`
    ticks at `rate`: per tick it draws about `requests_per_batch` requests per worker from one
    shared workload, routes each session to its worker (assigned round robin when the session
    starts, moved to another worker with probability `migrate_prob` per turn, as a router
    rebalancing would), and publishes each worker's events of the tick as one batch. Truth per
    worker comes from the engines; it matches what was published once `run` has returned.
    """

    def __init__(
        self,
        *,
        pods: int | Sequence[str] = 3,
        dp_size: int = 1,
        base_port: int | None = None,
        host: str = "127.0.0.1",
        model: str = "model",
        sessions: int = 16,
        seed: int = 0,
        num_blocks: int = 2048,
        block_size: int = 16,
        requests_per_batch: int = 4,
        migrate_prob: float = 0.05,
        report_mode_full: bool = True,
        buffer_steps: int = DEFAULT_BUFFER_STEPS,
        workload: AgenticWorkload | None = None,
        context: zmq.asyncio.Context | None = None,
        session_idle: float | None = None,
    ) -> None:
        """`base_port` None or 0 picks free ports; else pod i uses 2*dp_size ports from
        base_port + 2*dp_size*i: PUB ports first (one per rank), then ROUTER ports.
        `context` None: one of its own, sized for its workers, destroyed by `close`.
        `session_idle`: the engines forget a session's truth this many seconds after its
        last store there, as the index's idle rule does (a long-running demo stays bounded);
        None keeps every session's truth, which tests comparing against it need.
        """
        names = pod_names(pods) if isinstance(pods, int) else list(pods)
        if not names or len(set(names)) != len(names):
            raise ValueError(f"pods must be distinct and non-empty, got {names}")
        if dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {dp_size}")
        self.pods = names
        self.dp_size = dp_size
        self.base_port = base_port or None
        self.host = host
        self.model = model
        self.requests_per_batch = requests_per_batch
        self.migrate_prob = migrate_prob
        self.workload = workload or AgenticWorkload(
            sessions=sessions, seed=seed, block_size=block_size
        )
        if self.workload.block_size != block_size:
            raise ValueError("workload and engines must share block_size")
        if self.workload.max_context_blocks > num_blocks:
            raise ValueError(
                f"num_blocks {num_blocks} cannot hold a session's context "
                f"({self.workload.max_context_blocks} blocks)"
            )
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._report_mode_full = report_mode_full
        self._buffer_steps = buffer_steps
        self._session_idle = session_idle
        self._own_ctx = context is None
        if context is None:
            # libzmq's default context holds 1,023 sockets: 511 publishers.
            workers = len(names) * dp_size
            context, _ = sized_context(
                workers * SOCKETS_PER_WORKER, workers * FILES_PER_WORKER + FILES_KEPT
            )
        self._ctx = context
        self._rng = random.Random(seed)
        self._workers: dict[tuple[str, int], _Worker] = {}
        self._order: list[tuple[str, int]] = []
        self._route: dict[str, tuple[str, int]] = {}
        self._next_assign = 0
        self._stop = asyncio.Event()
        # One tick publishes the events it computed for every worker; a restart or reset in
        # the middle would put an old engine's events on a new stream and break the truth.
        self._tick_lock = asyncio.Lock()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False
        self.stats = FleetStats()

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Bind every worker's sockets."""
        if self._workers:
            raise RuntimeError("fleet already started")
        try:
            for index, pod in enumerate(self.pods):
                await self._start_pod(index, pod)
        except BaseException:
            await self.close()
            raise
        for w in self.workers():
            log.info(
                "simulated worker up",
                pod=w.pod,
                dp_rank=w.dp_rank,
                endpoint=w.endpoint,
                replay_endpoint=w.replay_endpoint,
            )

    async def close(self) -> None:
        """Stop a run (waiting for its tick to finish) and close every socket."""
        self._closed = True
        self._stop.set()
        await self._idle.wait()
        for worker in self._workers.values():
            await worker.publisher.close()
        if self._own_ctx and not self._ctx.closed:
            self._ctx.destroy(linger=0)

    async def __aenter__(self) -> SimulatedFleet:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def stop(self) -> None:
        """Make a running `run` return after its current tick."""
        self._stop.set()

    # -- addresses and truth -------------------------------------------------------------

    def endpoints(self) -> list[tuple[str, str, str]]:
        """(pod, PUB endpoint, replay endpoint) per pod, as its vLLM config would name them.

        These are rank 0's; rank r listens on each port + r (vLLM's DP offset), see `workers`.
        """
        return [(w.pod, w.endpoint, w.replay_endpoint) for w in self.workers() if w.dp_rank == 0]

    def workers(self) -> list[WorkerEndpoints]:
        """Every worker's endpoints, pod by pod, rank by rank."""
        out = []
        for key in self._order:
            w = self._workers[key]
            replay = w.publisher.replay_endpoint
            assert replay is not None
            out.append(
                WorkerEndpoints(
                    w.pod, w.dp_rank, _advertised(w.publisher.endpoint), _advertised(replay)
                )
            )
        return out

    def engine(self, pod: str, dp_rank: int = 0) -> SimulatedEngine:
        """The worker's engine: its `resident()` and `session_residency()` are the truth."""
        return self._worker(pod, dp_rank).engine

    def publisher(self, pod: str, dp_rank: int = 0) -> SimulatedPublisher:
        """The worker's publisher, for fault injection (`drop_next`) and probes (`send_raw`)."""
        return self._worker(pod, dp_rank).publisher

    def resident(self, pod: str, dp_rank: int = 0) -> set[int]:
        """Blocks the worker holds now."""
        return self.engine(pod, dp_rank).resident()

    def session_residency(self, pod: str, dp_rank: int = 0) -> dict[str, set[int]]:
        """Session residency on the worker (DESIGN.md's definition)."""
        return self.engine(pod, dp_rank).session_residency()

    def session_truth(self, session_id: str) -> dict[tuple[str, int], set[int]]:
        """Where a session's blocks are, per worker holding any."""
        out = {}
        for key in self._order:
            blocks = self._workers[key].engine.session_residency().get(session_id)
            if blocks:
                out[key] = blocks
        return out

    def loss_truth(self, session_id: str) -> dict[tuple[str, int], int]:
        """Per worker where the session lost blocks since it last stored there: how many
        (since the worker's engine started: a `restart_pod` starts a new truth)."""
        out = {}
        for key in self._order:
            lost = self._workers[key].engine.session_losses().get(session_id)
            if lost:
                out[key] = lost
        return out

    def frontier_truth(self, session_id: str) -> dict[tuple[str, int], tuple[int, int]]:
        """Per worker where the session stored: its last stored block and its prompt index."""
        out = {}
        for key in self._order:
            frontier = self._workers[key].engine.session_frontiers().get(session_id)
            if frontier is not None:
                out[key] = frontier
        return out

    # -- faults --------------------------------------------------------------------------

    async def restart_pod(self, pod: str) -> None:
        """Kill and restart every worker of `pod`: empty cache, seq from 0, same endpoints.

        A fresh vLLM starts empty and publishes no AllBlocksCleared: the subscriber has to
        notice the seq going back.
        """
        async with self._tick_lock:
            for rank in range(self.dp_size):
                worker = self._worker(pod, rank)
                old = worker.publisher
                endpoint, replay = old.endpoint, old.replay_endpoint
                await old.close()
                worker.engine = self._new_engine()
                worker.publisher = self._publisher(pod, rank, endpoint, replay)
                await worker.publisher.start()
        log.info("simulated pod restarted", pod=pod)

    async def reset_pod(self, pod: str) -> None:
        """Reset the prefix cache of every worker of `pod` and publish the AllBlocksCleared."""
        async with self._tick_lock:
            for rank in range(self.dp_size):
                worker = self._worker(pod, rank)
                await worker.publisher.publish(worker.engine.reset())

    # -- driving -------------------------------------------------------------------------

    async def run(
        self,
        rate: float,
        *,
        duration: float | None = None,
        max_batches: int | None = None,
    ) -> FleetStats:
        """Tick `rate` times a second (per worker) until `duration`, `max_batches` ticks,
        `stop()`, or the workload ends; returns the stats of this run.

        `rate` <= 0 or infinite runs as fast as the loop allows. A tick whose worker got no
        request publishes nothing for it, as an idle engine would.
        """
        self._stop.clear()
        return await self._run_once(rate, duration, max_batches)

    def run_in_background(
        self,
        rate: float,
        *,
        duration: float | None = None,
        max_batches: int | None = None,
    ) -> asyncio.Task[FleetStats]:
        """`run` as a task of the current loop (the in-process demo of `kvsi serve --demo`).

        A `stop()` or `close()` issued before the task first runs still ends it.
        """
        self._stop.clear()
        return asyncio.create_task(
            self._run_once(rate, duration, max_batches), name="simulated fleet"
        )

    async def _run_once(
        self, rate: float, duration: float | None, max_batches: int | None
    ) -> FleetStats:
        if self._closed:
            return FleetStats()  # closed before a background run began: nothing to do
        if not self._workers:
            raise RuntimeError("fleet not started")
        if not self._idle.is_set():
            raise RuntimeError("fleet already running")
        self._idle.clear()
        try:
            return await self._run(rate, duration, max_batches)
        finally:
            self._idle.set()

    async def _run(
        self, rate: float, duration: float | None, max_batches: int | None
    ) -> FleetStats:
        stats = FleetStats()
        loop = asyncio.get_running_loop()
        began = loop.time()
        paced = rate > 0 and math.isfinite(rate)
        while not self._stop.is_set():
            if max_batches is not None and stats.ticks >= max_batches:
                break
            now = loop.time()
            if duration is not None and now - began >= duration:
                break
            if paced:
                due = math.floor((now - began) * rate) + 1 - stats.ticks
                if due <= 0:
                    wait = (stats.ticks / rate) - (now - began)
                    if duration is not None:
                        wait = min(wait, duration - (now - began))
                    await self._sleep_or_stop(max(wait, 0.0) + _TIMER_SLACK)
                    continue
                due = min(due, _MAX_CATCH_UP_TICKS)
            else:
                due = 1
            for _ in range(due):
                if max_batches is not None and stats.ticks >= max_batches:
                    break
                if not await self._tick(stats):
                    self._stop.set()
                    break
            if not paced or due == _MAX_CATCH_UP_TICKS:
                await asyncio.sleep(0)
        stats.seconds = loop.time() - began
        self._accumulate(stats)
        return stats

    async def _tick(self, stats: FleetStats) -> bool:
        """One batch per worker with events; False when the workload has ended."""
        async with self._tick_lock:
            return await self._tick_locked(stats)

    async def _tick_locked(self, stats: FleetStats) -> bool:
        pending: dict[tuple[str, int], list[KVCacheEvent]] = {}
        ended = False
        for _ in range(self.requests_per_batch * len(self._order)):
            request = self.workload.next_request()
            if request is None:
                ended = True
                break
            key = self._route_request(request)
            engine = self._workers[key].engine
            pending.setdefault(key, []).extend(
                engine.run_request(request.session_id, request.token_ids)
            )
            stats.requests += 1
        for key in self._order:
            batch = pending.get(key)
            if not batch:
                continue
            await self._workers[key].publisher.publish(batch)
            stats.batches += 1
            stats.events += len(batch)
        stats.ticks += 1
        if self._session_idle is not None:
            idle_since = time.time() - self._session_idle
            for worker in self._workers.values():
                worker.engine.forget_idle(idle_since)
        return not ended

    def _route_request(self, request: Request) -> tuple[str, int]:
        key = self._route.get(request.session_id)
        if key is None:
            key = self._order[self._next_assign % len(self._order)]
            self._next_assign += 1
        elif len(self._order) > 1 and self._rng.random() < self.migrate_prob:
            key = self._rng.choice([k for k in self._order if k != key])
        if request.last:
            self._route.pop(request.session_id, None)
        else:
            self._route[request.session_id] = key
        return key

    async def _sleep_or_stop(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._stop.wait()

    def _accumulate(self, run: FleetStats) -> None:
        self.stats.ticks += run.ticks
        self.stats.batches += run.batches
        self.stats.requests += run.requests
        self.stats.events += run.events
        self.stats.seconds += run.seconds

    # -- setup helpers -------------------------------------------------------------------

    def _new_engine(self) -> SimulatedEngine:
        return SimulatedEngine(
            num_blocks=self._num_blocks,
            block_size=self._block_size,
            report_mode_full=self._report_mode_full,
        )

    def _worker(self, pod: str, dp_rank: int) -> _Worker:
        try:
            return self._workers[(pod, dp_rank)]
        except KeyError:
            known = ", ".join(f"{p}/{r}" for p, r in self._order)
            raise KeyError(f"no worker {pod}/{dp_rank}; known: {known}") from None

    def _publisher(
        self, pod: str, rank: int, endpoint: str, replay: str | None
    ) -> SimulatedPublisher:
        return SimulatedPublisher(
            endpoint,
            replay_endpoint=replay,
            pod=pod,
            model=self.model,
            data_parallel_rank=rank,
            buffer_steps=self._buffer_steps,
            context=self._ctx,
        )

    async def _start_pod(self, index: int, pod: str) -> None:
        if self.base_port is not None:
            first = self.base_port + 2 * self.dp_size * index
            await self._bind_pod(pod, first, bind_timeout=0.0)
            return
        if self.dp_size == 1:
            await self._bind_pod(pod, None, bind_timeout=0.0)
            return
        # Ranks need consecutive ports (vLLM's offset rule): try random ranges until one binds.
        for _ in range(_AUTO_PORT_ATTEMPTS):
            first = _PORT_RNG.randrange(20_000, 60_000)
            try:
                await self._bind_pod(pod, first, bind_timeout=0.0)
                return
            except FleetBindError as exc:
                if not exc.in_use:
                    raise
        raise FleetBindError(
            f"no free range of {2 * self.dp_size} consecutive ports found for {pod} in "
            f"{_AUTO_PORT_ATTEMPTS} tries",
            in_use=True,
        )

    async def _bind_pod(self, pod: str, first: int | None, *, bind_timeout: float) -> None:
        started: list[_Worker] = []
        try:
            for rank in range(self.dp_size):
                if first is None:
                    endpoint = f"tcp://{self.host}:*"
                    replay = f"tcp://{self.host}:*"
                else:
                    endpoint = f"tcp://{self.host}:{first + rank}"
                    replay = f"tcp://{self.host}:{first + self.dp_size + rank}"
                publisher = self._publisher(pod, rank, endpoint, replay)
                try:
                    await publisher.start(bind_timeout=bind_timeout)
                except zmq.ZMQError as exc:
                    raise FleetBindError(
                        f"simulated pod {pod}/{rank} cannot bind {endpoint} and {replay}: "
                        f"{exc.strerror}",
                        in_use=exc.errno == zmq.EADDRINUSE,
                    ) from exc
                engine = self._new_engine()
                started.append(_Worker(pod, rank, engine, publisher))
        except BaseException:
            for worker in started:
                await worker.publisher.close()
            raise
        for worker in started:
            key = (worker.pod, worker.dp_rank)
            self._workers[key] = worker
            self._order.append(key)


class FleetBindError(RuntimeError):
    """A simulated pod could not bind its ports (taken, or not an address of this host)."""

    def __init__(self, message: str, *, in_use: bool = False) -> None:
        super().__init__(message)
        self.in_use = in_use


def _advertised(endpoint: str) -> str:
    """A connectable form of a bound endpoint (a wildcard host becomes loopback)."""
    for wildcard in ("tcp://0.0.0.0:", "tcp://*:"):
        if endpoint.startswith(wildcard):
            return "tcp://127.0.0.1:" + endpoint[len(wildcard) :]
    return endpoint


async def simulate(
    pods: int,
    base_port: int,
    rate: float,
    sessions: int,
    seed: int,
    duration: float | None,
    *,
    host: str = "127.0.0.1",
    dp_size: int = 1,
    model: str = "model",
) -> None:
    """`kvsi simulate`: serve a fleet until `duration` elapses (None: until cancelled).

    `base_port` 0 picks free ports; the endpoints are logged either way.
    """
    fleet = SimulatedFleet(
        pods=pods,
        dp_size=dp_size,
        base_port=base_port,
        host=host,
        model=model,
        sessions=sessions,
        seed=seed,
    )
    async with fleet:
        stats = await fleet.run(rate, duration=duration)
    log.info(
        "simulation finished",
        ticks=stats.ticks,
        batches=stats.batches,
        requests=stats.requests,
        events=stats.events,
        seconds=round(stats.seconds, 3),
    )


__all__ = [
    "FleetBindError",
    "FleetStats",
    "SimulatedFleet",
    "WorkerEndpoints",
    "pod_names",
    "simulate",
]
