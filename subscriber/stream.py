"""One publisher's stream: its sockets, its tasks and their timing.

Imports zmq and the store contract; never the API. Per message: receiver task (receiver.py:
SUB -> inbox.py, in bursts) -> applier task -> applier.py (framing, decode, the order rules
of order.py, the store through gate.py). The applier task is the worker's only writer of
batches and also runs what is due in between (a catch-up after a connect, the index audit,
the stale policy); the worker's health (health.py) reaches the store through a status
writer task.
subscriber/README.md has the states and the stale policy.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

import msgspec
import zmq
import zmq.asyncio
from structlog.typing import FilteringBoundLogger
from zmq.utils.monitor import recv_monitor_message

from kvsi.store.model import Fence, WorkerKey, WorkerState, WorkerStatus
from kvsi.subscriber import metrics
from kvsi.subscriber.applier import RUN_MAX, Applier
from kvsi.subscriber.framing import SEQ_BYTES
from kvsi.subscriber.gate import StoreGate
from kvsi.subscriber.health import WorkerHealth
from kvsi.subscriber.inbox import Inbox
from kvsi.subscriber.receiver import Receiver
from kvsi.subscriber.replay import ReplayClient
from kvsi.subscriber.sockets import ResourceError, StreamRoom, open_live
from kvsi.subscriber.topic import model_of_topic
from kvsi.subscriber.turns import Turns

RESOURCE_RETRY_SECONDS = 0.1
"""First pause before a stream tries again to open a socket a resource limit refused."""

RESOURCE_RETRY_MAX_SECONDS = 5.0
"""Longest pause between those tries: a freed socket or descriptor is used within this."""

YIELD_EVERY = 64
"""Messages applied back to back before the applier yields: draining a full inbox into a
store that never suspends must not starve the receiver, other streams or the API. Where
the process's turns have a budget (turns.py), they bound it instead, for every stream at
once."""

_clock = time.perf_counter


@dataclass(frozen=True)
class PublisherSpec:
    """Where one vLLM publisher (one pod, one DP rank) listens."""

    pod: str
    endpoint: str
    replay_endpoint: str | None = None
    dp_rank: int = 0
    """Rank assumed until a batch names its own `data_parallel_rank`."""
    topic: str = ""
    """ZMQ prefix filter; vLLM's topic is often `kv@<pod>@<model>`."""
    model: str | None = None
    """The model the worker serves; None: the one its topic names, if any."""


@dataclass(frozen=True)
class IngestOptions:
    """Bounds of ingest (kvsi.settings documents each; these are its defaults)."""

    queue_size: int = 10_000
    replay_timeout: float = 2.0
    replay_attempts: int = 3
    max_concurrent_replays: int = 4
    unconfirmed_ttl: float = 300.0
    store_retry_max: float = 2.0
    index_audit: float = 5.0
    max_workers: int = 1024
    tokens_hashes: bool = False
    """Stores carry Dynamo's hashes of their blocks' tokens (the Dynamo API is on)."""


class WorkerStream:
    """Subscribes to one publisher and has its batches applied to the store in seq order.

    Owns the SUB and its connection monitor, the inbox, the tasks (receiver, applier,
    monitor, audit clock, status writer), the resource backoff and the lag gauges; what a
    batch means and what to do about it is the applier's (applier.py, order.py).
    """

    def __init__(
        self,
        spec: PublisherSpec,
        gate: StoreGate,
        ctx: zmq.asyncio.Context,
        *,
        options: IngestOptions | None = None,
        replay_limit: asyncio.Semaphore | None = None,
        room: StreamRoom | None = None,
        turns: Turns | None = None,
    ) -> None:
        """`room`: the process's budget of streams (None: not counted). `turns`: when the
        process's streams apply (None: at once)."""
        self.spec = spec
        self._turns = turns or Turns(None)
        self._gate = gate
        self._ctx = ctx
        self._room = room
        self._retry_pause = RESOURCE_RETRY_SECONDS
        self._options = options or IngestOptions()
        self._audit_due = False
        self._holding = 0
        """Live messages the applier took from the inbox and is still applying."""
        self._busy_since: float | None = None
        self.inbox = Inbox(self._options.queue_size)
        self.health = WorkerHealth(spec.endpoint, spec.model or model_of_topic(spec.topic))
        worker = WorkerKey(spec.pod, spec.dp_rank)
        self.counters = metrics.WorkerCounters(str(worker))
        self._applier = Applier(
            worker,
            gate,
            self.health,
            self.counters,
            replay=self._replay_client(replay_limit),
            unconfirmed_ttl=self._options.unconfirmed_ttl,
            tokens_hashes=self._options.tokens_hashes,
            wake=self.inbox.wake,
            wait_out=self._wait_out,
            resourced=self._resourced,
        )

    def _replay_client(self, limit: asyncio.Semaphore | None) -> ReplayClient | None:
        if self.spec.replay_endpoint is None:
            return None
        options = self._options
        return ReplayClient(
            self._ctx,
            self.spec.replay_endpoint,
            timeout=options.replay_timeout,
            attempts=options.replay_attempts,
            limit=limit or asyncio.Semaphore(options.max_concurrent_replays),
            on_drop=lambda reason: self._applier.drop(reason),
            turns=self._turns,
        )

    @property
    def worker(self) -> WorkerKey:
        """The worker this stream feeds; its rank is the spec's until a batch names one."""
        return self._applier.worker

    @property
    def _log(self) -> FilteringBoundLogger:
        return self._applier.log

    @property
    def fence(self) -> Fence | None:
        """Where this stream stands: the last seq it decided (applied or consumed) and its epoch."""
        return self._applier.order.fence

    # -- tasks ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Receive and apply until cancelled; never raises for bad input, a store outage or
        a resource limit (the worker shows `degraded` with why until the socket opens)."""
        metrics.INGEST.track(self)
        status = asyncio.create_task(self._write_status(), name=f"status:{self.spec.pod}")
        try:
            sock, monitor = await self._open_live()
            try:
                await self._follow(sock, monitor)
            finally:
                sock.disable_monitor()
                monitor.close(linger=0)
                sock.close(linger=0)
                if self._room is not None:
                    self._room.give_back()
        finally:
            status.cancel()
            await asyncio.gather(status, return_exceptions=True)
            metrics.INGEST.untrack(self)

    async def _follow(self, sock: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket) -> None:
        tasks = [
            asyncio.create_task(self._receive(sock), name=f"receive:{self.spec.pod}"),
            asyncio.create_task(self._watch_connection(monitor), name=f"monitor:{self.spec.pod}"),
            asyncio.create_task(self._audit_clock(), name=f"audit:{self.spec.pod}"),
        ]
        self._log.info("stream.connect", endpoint=self.spec.endpoint)
        try:
            # Where a restarted sidecar resumes; the receiver buffers while the store answers.
            self._applier.order.load(await self._gate.fence(self.worker))
            await self._apply_forever()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _open_live(self) -> tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]:
        """The SUB and its monitor, once this process has room for them (see sockets.py)."""
        while True:
            try:
                opened = open_live(self._ctx, self.spec.topic, self.spec.endpoint, self._room)
            except ResourceError as exc:
                await self._wait_out(exc)
                continue
            self._resourced()
            return opened

    async def _wait_out(self, exc: ResourceError) -> None:
        """A resource limit stopped this stream: `degraded` with why, counted once per
        episode (not per retry), tried again after a pause that doubles up to
        RESOURCE_RETRY_MAX_SECONDS."""
        if self.health.blocked_detail is None:
            failures = self.counters.resource_failures
            failures[exc.reason] = failures.get(exc.reason, 0) + 1
            self._log.error("stream.resource_failure", reason=exc.reason.value, error=str(exc))
        self.health.blocked(str(exc))
        await asyncio.sleep(self._retry_pause)
        self._retry_pause = min(self._retry_pause * 2, RESOURCE_RETRY_MAX_SECONDS)

    def _resourced(self) -> None:
        """The socket a resource limit kept closed is open: the worker shows as before."""
        self._retry_pause = RESOURCE_RETRY_SECONDS
        if self.health.blocked_detail is not None:
            self._log.info("stream.resource_recovered")
            self.health.blocked(None)

    async def _receive(self, sock: zmq.asyncio.Socket) -> None:
        """SUB -> inbox, never waiting on anything else (see inbox.py for why). A topic frame
        unlike the last one names the worker's model, unless the configuration set it."""
        learn = self.spec.model is None
        receiver = Receiver(
            sock,
            self.inbox,
            on_topic=self._name_model if learn else None,
            on_overflow=self._overflowed,
        )
        await receiver.run()

    def _name_model(self, topic: bytes) -> None:
        self.health.name_model(model_of_topic(topic))

    async def _apply_forever(self) -> None:
        inbox = self.inbox
        health = self.health
        applier = self._applier
        order = applier.order
        turns = self._turns
        held = False  # let go by the turns, and applying without a pause since
        since_yield = 0
        while True:
            if await self._upkeep():
                held = False  # it paused: its next run waits in line
            if inbox.last_dropped is not None and not len(inbox):
                # The newest message a full inbox dropped, offered once the held ones are
                # applied: it reveals (and so repairs) the hole even if the publisher goes quiet.
                self._busy_since, frames = inbox.take_dropped()
                await self.on_message(frames)
                self._busy_since = None
                health.repairing(None)
                held = False
                continue
            if not len(inbox):
                held = False  # it pauses: its next message waits in line
            wait = health.seconds_to_stale_drop()
            if wait is None:
                item = await inbox.get()
            else:
                try:
                    async with asyncio.timeout(wait):
                        item = await inbox.get()
                except TimeoutError:
                    continue  # the stale policy is due
            if item is None:
                continue
            self._busy_since = item[0]
            self._holding = 1
            if not turns.open(held):
                await turns.wait()
                held = True
            started = _clock()
            messages = [item[1]]
            if len(inbox) and order.may_group:
                messages += inbox.take(RUN_MAX - 1)
            self._holding = len(messages)
            await applier.on_live(messages)
            turns.spend(_clock() - started)
            since_yield += self._holding
            self._busy_since = None
            self._holding = 0
            if since_yield >= YIELD_EVERY:
                since_yield = 0
                if not turns.bounded:
                    await asyncio.sleep(0)

    async def _upkeep(self) -> bool:
        """The applier's work besides live runs, when due: the index audit, the catch-up
        after a (re)connect, the stale policy. Returns whether any ran."""
        applier = self._applier
        ran = False
        if self._audit_due:
            await self._audit()
            ran = True
        if applier.order.resync:
            await applier.catch_up("publisher connected")
            ran = True
        deadline = self.health.stale_deadline
        if deadline is not None and deadline <= time.monotonic():
            await applier.drop_stale()
            ran = True
        return ran

    async def _watch_connection(self, monitor: zmq.asyncio.Socket) -> None:
        """Socket connects and disconnects become worker status; a connect triggers a resync."""
        while True:
            event = await recv_monitor_message(monitor)
            if event["event"] == zmq.EVENT_CONNECTED:
                self.health.connect(True)
                # Late join, sidecar restart, reconnect: ask for what we may have missed now,
                # not at the next live message (an idle engine may send none for a long time).
                self._applier.order.resync = True
                self.inbox.wake()
                self._log.info("stream.connected", endpoint=self.spec.endpoint)
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.health.connect(False)
                self._log.warning("stream.disconnected", endpoint=self.spec.endpoint)

    async def _audit_clock(self) -> None:
        """Every `index_audit` seconds, ask the applier to check the store (see `_audit`).
        The first time at a random point of the first period: streams started together (a
        central process following a fleet) audit spread over the period, not all at once."""
        period = self._options.index_audit
        await asyncio.sleep(random.uniform(0, period))
        while True:
            self._audit_due = True
            self.inbox.wake()
            await asyncio.sleep(period)

    def restatus(self) -> None:
        """Store the worker's status again (the status task writes what it is now): the
        statuses' fence moved, and a replica that owned the worker in between may have
        stored its own."""
        self.health.changed.set()

    async def _audit(self) -> None:
        """Whether the store still holds what this stream stored; status written again.

        An idle engine sends nothing that would reveal a store that came back empty, so the
        applier looks: a fence behind the one seen stored is a lost index, rebuilt now; the
        status is stored again in any case (a status lost with the data lists the worker).
        """
        self._audit_due = False
        await self._applier.audit()
        self.health.changed.set()

    async def _write_status(self) -> None:
        """The one writer of this stream's worker status: the latest state always wins."""
        while True:
            await self.health.changed.wait()
            self.health.changed.clear()
            forget, self._applier.forget = self._applier.forget, None
            if forget is not None and await self._gate.fence(forget) is None:
                # The assumed rank was wrong and nothing was ever applied under it.
                await self._gate.remove_worker(forget)
            written = 0

            def current() -> tuple[WorkerKey, WorkerStatus]:
                nonlocal written
                written = self.health.version
                return self.worker, self._status()

            await self._gate.publish_status(current)
            self.health.stored(written)

    def _status(self) -> WorkerStatus:
        """The health's status with the stream's counters, as the fleet view shows them."""
        c = self.read_counters()
        return msgspec.structs.replace(
            self.health.status(),
            gaps=c.gaps,
            replays=sum(c.replays.values()),
            restarts=c.restarts,
            lag_batches=c.lag_batches,
            lag_seconds=round(c.lag_seconds, 3),
        )

    async def on_message(self, frames: list[bytes]) -> None:
        """Handle one live message `[topic, seq, payload]`; never raises for bad input."""
        await self._applier.on_live([frames])

    # -- accounting -----------------------------------------------------------------------

    def _overflowed(self) -> None:
        if self.health.repairing_detail is None:
            self._log.warning("stream.queue_full", capacity=self.inbox.capacity)
        self.health.repairing(
            f"live batches dropped by a full ingest queue ({self.inbox.capacity} held); "
            "repairing by replay"
        )

    def read_counters(self) -> metrics.WorkerCounters:
        """The counters, with lag and the other gauges brought up to date (for /metrics)."""
        counters = self.counters
        inbox = self.inbox
        counters.queue_overflow = inbox.overflowed
        counters.queued = len(inbox) + self._holding
        applied = self._applier.order.applied
        counters.applied_seq = applied
        newest = _seq_of(inbox.newest)
        if applied is not None and (newest is None or newest < applied):
            newest = applied
        counters.last_seq = newest
        if newest is None:
            counters.lag_batches = 0
        else:
            counters.lag_batches = newest - (-1 if applied is None else applied)
        oldest = self._busy_since if self._busy_since is not None else inbox.oldest_arrival()
        counters.lag_seconds = 0.0 if oldest is None else time.monotonic() - oldest
        counters.connected = bool(self.health.connected)
        # What /v1/pods shows: an unrepaired loss, or a repair by replay still running.
        counters.degraded = self.health.status().state is WorkerState.DEGRADED
        return counters

    def readiness_reasons(self) -> list[str]:
        """Why this stream keeps the service from being ready ([] when it does not)."""
        reasons = []
        queued = len(self.inbox) + self._holding
        oldest = self._busy_since if self._busy_since is not None else self.inbox.oldest_arrival()
        if oldest is not None and (not self._gate.available or oldest <= self._gate.recovered_at):
            reasons.append(
                f"worker {self.worker}: {queued} batches buffered during the index store outage "
                f"not applied yet (queue holds {self.inbox.capacity})"
            )
        for detail in (self.health.blocked_detail, self.health.repairing_detail):
            if detail is not None:
                reasons.append(f"worker {self.worker}: {detail}")
        return reasons


def _seq_of(frames: list[bytes] | None) -> int | None:
    if frames is None or len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
        return None
    return int.from_bytes(frames[1], "big")
