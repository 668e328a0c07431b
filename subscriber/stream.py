"""One publisher's ordered stream: receive, order by seq, repair gaps, detect restarts, apply.

Imports zmq and the store contract; never the API. Top to bottom, per message: receiver task
(SUB -> inbox.py) -> applier: framing.py -> decode.py -> `_place` (the order decision) ->
the store through gate.py. The applier is the worker's only writer of batches; a gap is
repaired by replay (replay.py) before the live message that revealed it is applied, so the
store sees each batch once, in seq order. Its health (health.py) reaches the store through a
status writer task. subscriber/README.md has the states and the stale policy.
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
from dataclasses import dataclass

import msgspec
import structlog
import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from kvsi import metrics
from store.model import (
    ApplyOutcome,
    Batch,
    EntriesRemoved,
    EntriesStored,
    Fence,
    IndexLostError,
    StoreEvent,
    WorkerCleared,
    WorkerKey,
    WorkerState,
    WorkerStatus,
    advance,
    decide,
    fell_behind,
)
from subscriber.decode import Decoded, ingest_decoder
from subscriber.drops import DropReason
from subscriber.framing import SEQ_BYTES, parse_live
from subscriber.gate import StoreGate
from subscriber.health import WorkerHealth
from subscriber.inbox import Inbox
from subscriber.replay import ReplayClient, ReplayFailedError, ReplayReport
from subscriber.sockets import ResourceError, StreamRoom, open_live
from subscriber.topic import model_of_topic

log = structlog.get_logger(__name__)

DROP_LOG_SECONDS = 10.0
"""At most one log line per drop reason per stream in this time (with the running count):
a publisher sending garbage must not flood the logs; the counters still count every drop."""

LOST_INDEX = "the index store lost this worker's index"
"""How a worker's state detail starts while (or after) rebuilding from replay."""

GROUP_MAX = 16
"""Most live batches of a backlog stored in one call (a Redis script runs them in one go:
~2 ms of Redis time at the bench's batch size, while other clients wait)."""

RESOURCE_RETRY_SECONDS = 0.1
"""First pause before a stream tries again to open a socket a resource limit refused."""

RESOURCE_RETRY_MAX_SECONDS = 5.0
"""Longest pause between those tries: a freed socket or descriptor is used within this."""

YIELD_EVERY = 64
"""Messages applied back to back before the applier yields: draining a full inbox into the
memory store never suspends, and must not starve the receiver, other streams or the API."""


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


class _Mode(enum.Enum):
    """Where a batch comes from, which decides what a gap before it means."""

    LIVE = "live"
    """A live message: a gap before it is repaired by replay first."""
    REPLAY = "replay"
    """A replayed batch: a gap before it means the publisher's buffer no longer reaches."""
    REPAIRED = "repaired"
    """A live message after its repair: a gap still before it is lost for good."""


class WorkerStream:
    """Subscribes to one publisher and applies its batches to the store in seq order.

    Per-message state lives here, not in the store: `_fence` mirrors the store's fence as
    this stream's applies moved it, so duplicates, previous-engine batches, gaps and restarts
    are told apart without a store round trip (the store's fence still guards every write).
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
    ) -> None:
        """`room`: the process's budget of streams (None: not counted)."""
        self.spec = spec
        self._gate = gate
        self._ctx = ctx
        self._room = room
        self._retry_pause = RESOURCE_RETRY_SECONDS
        self._options = options or IngestOptions()
        self.worker = WorkerKey(spec.pod, spec.dp_rank)
        """The worker this stream feeds; its rank is the spec's until a batch names one."""
        self._decoder = ingest_decoder()
        self._fence: Fence | None = None
        self._stored: Fence | None = None
        """The last fence this stream saw stored: a store whose fence falls behind it lost
        the worker's index (Redis back without its data, or the worker removed)."""
        self._rebuild_from: int | None = None
        """While rebuilding a lost index: the last seq the lost index held."""
        self._audit_due = False
        self._holding = 0
        """Live messages the applier took from the inbox and is still applying."""
        self._applied_any = False
        self._forget: WorkerKey | None = None
        self.inbox = Inbox(self._options.queue_size)
        self.health = WorkerHealth(spec.endpoint, spec.model or model_of_topic(spec.topic))
        self.counters = metrics.WorkerCounters(str(self.worker))
        self._log = log.bind(pod=spec.pod, worker=str(self.worker), dp_rank=spec.dp_rank)
        self._replay: ReplayClient | None = None
        if spec.replay_endpoint is not None:
            limit = replay_limit or asyncio.Semaphore(self._options.max_concurrent_replays)
            self._replay = ReplayClient(
                ctx,
                spec.replay_endpoint,
                timeout=self._options.replay_timeout,
                attempts=self._options.replay_attempts,
                limit=limit,
                on_drop=self._drop,
            )
        self._resync = False
        self._replay_start = 0
        self._restart_seen = False
        self._repair_failure: str | None = None
        self._busy_since: float | None = None
        self._drop_logged: dict[DropReason, float] = {}

    @property
    def fence(self) -> Fence | None:
        """Where this stream stands: the last seq it applied (or consumed) and its epoch."""
        return self._fence

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
            self._fence = self._stored = await self._gate.fence(self.worker)
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
        put = self.inbox.put
        learn = self.spec.model is None
        topic = b""
        while True:
            frames = await sock.recv_multipart()
            if learn and frames[0] != topic:
                topic = frames[0]
                self.health.name_model(model_of_topic(topic))
            if not put(frames):
                self._overflowed()

    async def _apply_forever(self) -> None:
        inbox = self.inbox
        health = self.health
        since_yield = 0
        while True:
            if self._audit_due:
                await self._audit()
            if self._resync:
                await self._catch_up("publisher connected")
            if health.stale_deadline is not None and health.stale_deadline <= time.monotonic():
                await self._drop_stale()
            if inbox.last_dropped is not None and not len(inbox):
                # The newest message a full inbox dropped, offered once the held ones are
                # applied: it reveals (and so repairs) the hole even if the publisher goes quiet.
                self._busy_since, frames = inbox.take_dropped()
                await self.on_message(frames)
                self._busy_since = None
                health.repairing(None)
                continue
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
            if len(inbox) and not self._resync and self._rebuild_from is None:
                messages = [item[1], *inbox.take(GROUP_MAX - 1)]
                self._holding = len(messages)
                await self._on_backlog(messages)
            else:
                self._holding = 1
                await self.on_message(item[1])
            since_yield += self._holding
            self._busy_since = None
            self._holding = 0
            if since_yield >= YIELD_EVERY:
                since_yield = 0
                await asyncio.sleep(0)

    async def _watch_connection(self, monitor: zmq.asyncio.Socket) -> None:
        """Socket connects and disconnects become worker status; a connect triggers a resync."""
        while True:
            event = await recv_monitor_message(monitor)
            if event["event"] == zmq.EVENT_CONNECTED:
                self.health.connect(True)
                # Late join, sidecar restart, reconnect: ask for what we may have missed now,
                # not at the next live message (an idle engine may send none for a long time).
                self._resync = True
                self.inbox.wake()
                self._log.info("stream.connected", endpoint=self.spec.endpoint)
            elif event["event"] == zmq.EVENT_DISCONNECTED:
                self.health.connect(False)
                self._log.warning("stream.disconnected", endpoint=self.spec.endpoint)

    async def _audit_clock(self) -> None:
        """Every `index_audit` seconds, ask the applier to check the store (see `_audit`)."""
        while True:
            await asyncio.sleep(self._options.index_audit)
            self._audit_due = True
            self.inbox.wake()

    async def _audit(self) -> None:
        """Whether the store still holds what this stream stored; status written again.

        An idle engine sends nothing that would reveal a store that came back empty, so the
        applier looks: a fence behind the one seen stored is a lost index, rebuilt now; the
        status is stored again in any case (a status lost with the data lists the worker).
        """
        self._audit_due = False
        stored = await self._gate.fence(self.worker)
        if fell_behind(stored, self._stored):
            where = "no fence" if stored is None else f"fence seq {stored.seq}"
            await self._index_lost(f"the store holds {where}, behind what it held before")
        self.health.changed.set()

    async def _write_status(self) -> None:
        """The one writer of this stream's worker status: the latest state always wins."""
        while True:
            await self.health.changed.wait()
            self.health.changed.clear()
            forget, self._forget = self._forget, None
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

    # -- the data path --------------------------------------------------------------------

    async def on_message(self, frames: list[bytes]) -> None:
        """Handle one live message `[topic, seq, payload]`; never raises for bad input."""
        self.counters.messages += 1
        parsed = parse_live(frames)
        if isinstance(parsed, DropReason):
            self._drop(parsed)
            return
        seq, payload = parsed
        await self._offer(seq, payload, _Mode.LIVE)

    async def _on_backlog(self, messages: list[list[bytes]]) -> None:
        """Live messages held back to back (a backlog): runs of batches that simply follow
        the fence go to the store together (`apply_many`: one call, one Redis script for
        the run); any other message is handled alone, after the run before it is stored."""
        run: list[Batch] = []
        for frames in messages:
            self.counters.messages += 1
            parsed = parse_live(frames)
            if isinstance(parsed, DropReason):
                self._drop(parsed)
                continue
            seq, payload = parsed
            decoded = self._decoder.decode(payload)
            batch = self._follows(seq, decoded)
            if batch is not None:
                run.append(batch)
                self._fence = advance(self._fence, ApplyOutcome.APPLIED, seq, batch.ts)
                continue
            await self._apply_run(run)
            run = []
            await self._accept(seq, decoded, _Mode.LIVE)
        await self._apply_run(run)

    def _follows(self, seq: int, decoded: Decoded[StoreEvent]) -> Batch | None:
        """The batch, if it is clean and the very next one the fence applies; else None."""
        fence = self._fence
        if (
            fence is None
            or seq != fence.seq + 1
            or not decoded.ok
            or decoded.dropped
            or not math.isfinite(decoded.ts)
            or decoded.data_parallel_rank not in (None, self.worker.dp_rank)
            or decide(fence, seq, decoded.ts) is not ApplyOutcome.APPLIED
        ):
            return None
        return Batch(seq, decoded.ts, decoded.events)

    async def _apply_run(self, run: list[Batch]) -> None:
        """Store a run `_on_backlog` collected (the fence already stands after it)."""
        if not run:
            return
        started = time.perf_counter()
        try:
            outcomes = await self._gate.apply_many(self.worker, run, self._stored)
        except IndexLostError as exc:
            await self._index_lost(str(exc))
            return
        metrics.APPLY_SECONDS.observe(time.perf_counter() - started)
        counters = self.counters
        for batch, stored in zip(run, outcomes, strict=True):
            counters.batches[stored] = counters.batches.get(stored, 0) + 1
            counters.block_events += _block_events(batch)
            await self._track_stored(stored, batch.seq, batch.ts)
            if self.health.degraded and _clears(batch):
                self.health.exact_again()
        self._applied_any = True

    async def _offer(self, seq: int, payload: bytes, mode: _Mode) -> bool:
        """Decode one batch and place it; False asks a running replay to stop."""
        return await self._accept(seq, self._decoder.decode(payload), mode)

    async def _accept(self, seq: int, decoded: Decoded[StoreEvent], mode: _Mode) -> bool:
        """Check a decoded batch and place it; False asks a running replay to stop."""
        for reason in decoded.dropped:
            self._drop(reason)
        if not decoded.ok:
            why = decoded.dropped[0].value if decoded.dropped else "unreadable"
            return await self._unusable(seq, f"batch seq {seq} unreadable ({why})", mode)
        if not math.isfinite(decoded.ts):
            # NaN never compares: one such ts in the fence would hide every later restart.
            self._drop(DropReason.MALFORMED_BATCH)
            return await self._unusable(seq, f"batch seq {seq} has ts {decoded.ts}", mode)
        rank = decoded.data_parallel_rank
        if rank is not None and rank != self.worker.dp_rank and not await self._learn_rank(rank):
            self._drop(DropReason.RANK_MISMATCH)
            return await self._unusable(
                seq, f"batch seq {seq} names data_parallel_rank {rank}, not {self.worker}", mode
            )
        return await self._place(seq, decoded, mode)

    async def _place(self, seq: int, decoded: Decoded[StoreEvent], mode: _Mode) -> bool:
        """The order decision: apply, skip, or repair what is missing before this batch."""
        fence = self._fence
        outcome = decide(fence, seq, decoded.ts)
        if outcome is ApplyOutcome.APPLIED:
            expected = 0 if fence is None else fence.seq + 1
            if seq == expected:
                return await self._apply(seq, decoded, outcome, mode)
            return await self._gap(seq, decoded, expected, mode)
        if outcome is ApplyOutcome.RESTARTED:
            if seq == 0:
                return await self._apply(seq, decoded, outcome, mode)
            return await self._restart_gap(seq, decoded, mode)
        # DUPLICATE (held live messages a replay already applied) or PREVIOUS_ENGINE.
        self.counters.batches[outcome] = self.counters.batches.get(outcome, 0) + 1
        return True

    async def _apply(
        self, seq: int, decoded: Decoded[StoreEvent], outcome: ApplyOutcome, mode: _Mode
    ) -> bool:
        batch = Batch(seq, decoded.ts, decoded.events)
        started = time.perf_counter()
        try:
            stored = await self._gate.apply(self.worker, batch, self._stored)
        except IndexLostError as exc:
            await self._index_lost(str(exc))
            return mode is not _Mode.REPLAY  # a replay stops; the rebuild replays from 0
        metrics.APPLY_SECONDS.observe(time.perf_counter() - started)
        counters = self.counters
        counters.batches[stored] = counters.batches.get(stored, 0) + 1
        counters.block_events += _block_events(batch)
        self._fence = advance(self._fence, outcome, seq, decoded.ts)
        await self._track_stored(stored, seq, decoded.ts)
        self._applied_any = True
        if mode is _Mode.REPLAY:
            counters.batches_replayed += 1
        if outcome is ApplyOutcome.RESTARTED:
            # The store emptied the worker first: not a gap, and nothing stale is left.
            counters.restarts += 1
            self._log.warning("stream.engine_restart", seq=seq, ts=decoded.ts)
            self.health.exact_again()
        elif self.health.degraded and _clears(batch):
            self.health.exact_again()
        return True

    async def _track_stored(self, stored: ApplyOutcome, seq: int, ts: float) -> None:
        """Move `_stored` as the store's own outcome moved its fence (a lower bound of it).

        The store's outcome, not this stream's: the two fences differ after an unusable
        batch. DUPLICATE or PREVIOUS_ENGINE: the store is ahead, the bound stays. Without a
        bound yet (nothing was stored when the stream started), the fence is read once.
        """
        if self._stored is None:
            self._stored = await self._gate.fence(self.worker)
        elif stored is ApplyOutcome.APPLIED or stored is ApplyOutcome.RESTARTED:
            self._stored = advance(self._stored, stored, seq, ts)

    async def _gap(
        self, seq: int, decoded: Decoded[StoreEvent], expected: int, mode: _Mode
    ) -> bool:
        missed = seq - expected
        if mode is not _Mode.REPAIRED:
            self.counters.gaps += 1
            self.counters.batches_missed += missed
            self._log.warning("stream.gap", expected=expected, got=seq, mode=mode.value)
        if mode is _Mode.LIVE:
            await self._catch_up(f"gap before seq {seq}")
            return await self._place(seq, decoded, _Mode.REPAIRED)
        why = (
            f"the publisher's replay buffer starts at seq {seq}"
            if mode is _Mode.REPLAY
            else self._repair_failure or "replay did not return them"
        )
        detail = f"seqs {expected}..{seq - 1} lost: {why}"
        if self._rebuild_from is not None:
            detail = f"{LOST_INDEX}; {detail}"
        await self._lose(missed, detail, flag_entries=True)
        return await self._apply(seq, decoded, ApplyOutcome.APPLIED, mode)

    async def _restart_gap(self, seq: int, decoded: Decoded[StoreEvent], mode: _Mode) -> bool:
        """A new engine whose first batches (0..seq-1) we have not seen."""
        if mode is _Mode.LIVE:
            self._log.warning("stream.engine_restart_detected", got=seq, ts=decoded.ts)
            await self._catch_up(f"engine restart seen at seq {seq}")
            return await self._place(seq, decoded, _Mode.REPAIRED)
        if mode is _Mode.REPLAY and self._replay_start > 0:
            self._restart_seen = True  # `_catch_up` asks again from seq 0
            return False
        why = (
            f"the publisher's replay buffer starts at seq {seq}"
            if mode is _Mode.REPLAY
            else self._repair_failure or "replay did not return them"
        )
        await self._apply(seq, decoded, ApplyOutcome.RESTARTED, mode)
        # The new engine started empty: what we lack are its first stores, nothing stale to
        # flag. The worker under-reports until they are evicted or reported again.
        await self._lose(
            seq, f"engine restarted; its seqs 0..{seq - 1} lost: {why}", flag_entries=False
        )
        return True

    async def _unusable(self, seq: int, detail: str, mode: _Mode) -> bool:
        """A batch that cannot be applied (unreadable, wrong rank): its seq is consumed, lost.

        Its seq still counts, else the next batch would look like a gap whose replay returns
        the same bad batch again.
        """
        fence = self._fence
        if fence is not None and seq <= fence.seq:
            return True  # a repeat, or a new engine's: without a time there is no telling
        expected = 0 if fence is None else fence.seq + 1
        if seq > expected and mode is _Mode.LIVE:
            self.counters.gaps += 1
            self.counters.batches_missed += seq - expected
            await self._catch_up(f"gap before seq {seq}")
            return await self._unusable(seq, detail, _Mode.REPAIRED)
        lost = seq - expected + 1
        self._fence = (
            Fence(seq, 0.0, 0.0) if fence is None else Fence(seq, fence.epoch_ts, fence.last_ts)
        )
        if lost > 1:
            detail += f"; seqs {expected}..{seq - 1} before it lost too"
        await self._lose(lost, detail, flag_entries=True)
        return True

    # -- repair -------------------------------------------------------------------------

    async def _catch_up(self, why: str) -> None:
        """Replay from the last applied seq (from 0 without one) and apply what comes back.

        Asking from the last applied seq, not the one after, checks the engine: the same
        engine returns that batch again (a duplicate); a restarted one returns nothing there,
        or a newer batch under that seq. Then the replay starts over from 0, where the new
        engine's history begins.
        """
        self._resync = False
        self._repair_failure = None
        if self._replay is None:
            self._repair_failure = "no replay endpoint is configured"
            await self._rebuilt(None)
            self.health.repairing(None)
            self.health.synced()
            return
        if self.health.repairing_detail is not None:
            # Batches we dropped ourselves: the worker shows as degraded (repairing) in the
            # store before the repair starts, however short it turns out to be.
            await self.health.until_stored()
        fence = self._fence
        start = 0 if fence is None else fence.seq
        self._log.info("stream.catch_up", why=why, start=start)
        self._restart_seen = False
        losses = self.counters.index_lost
        report = await self._fetch(start)
        if self.counters.index_lost != losses:
            return  # the store lost the index meanwhile: the next round rebuilds from seq 0
        if start == 0:
            await self._rebuilt(report)
        if report is not None and start > 0 and (self._restart_seen or report.batches == 0):
            self._log.warning("stream.engine_replaced", last_applied=start)
            again = await self._fetch(0)
            if again is not None and again.batches == 0:
                # A restarted engine with nothing published yet: it holds nothing, so must we.
                await self._gate.clear_worker(self.worker)
                self.health.exact_again()
        self.health.repairing(None)
        if not self._resync:  # a connect since this catch-up began asks for another
            self.health.synced()

    async def _index_lost(self, detail: str) -> None:
        """The store lost this worker's index: forget the fence, rebuild by replay from seq 0.

        DEGRADED (repairing) until the replay from seq 0 is applied; if the publisher's
        buffer no longer reaches seq 0, or there is no replay, the missing seqs are lost for
        good and shown as such: the worker under-reports, never silently.
        """
        held = -1 if self._fence is None else self._fence.seq
        self._rebuild_from = max(held, -1 if self._rebuild_from is None else self._rebuild_from)
        self._fence = self._stored = None
        self.counters.index_lost += 1
        self._log.error("stream.index_lost", error=detail, last_seq=held)
        self.health.repairing(f"{LOST_INDEX} ({detail}); rebuilding it by replay from seq 0")
        self._resync = True
        self.inbox.wake()

    async def _rebuilt(self, report: ReplayReport | None) -> None:
        """After the replay from seq 0 that rebuilds a lost index: loss shown if it failed.

        A replay that starts after seq 0 was shown by `_gap`; one that returns nothing means
        a publisher without history (a new engine): it holds nothing, and neither do we.
        """
        held, self._rebuild_from = self._rebuild_from, None
        if held is None or report is not None or held < 0:
            return
        await self._lose(
            held + 1,
            f"{LOST_INDEX}; seqs 0..{held} not rebuilt: {self._repair_failure}",
            flag_entries=False,
        )

    async def _fetch(self, start: int) -> ReplayReport | None:
        assert self._replay is not None
        self._replay_start = start
        counters = self.counters
        try:
            report = await self._fetch_when_possible(start)
        except ReplayFailedError as exc:
            counters.replays["failed"] = counters.replays.get("failed", 0) + 1
            counters.replay_failures[exc.reason] = counters.replay_failures.get(exc.reason, 0) + 1
            self._repair_failure = str(exc)
            self._log.warning(
                "stream.replay_failed", start=start, reason=exc.reason, error=str(exc)
            )
            return None
        result = "stopped" if report.stopped else "complete"
        counters.replays[result] = counters.replays.get(result, 0) + 1
        self._log.info(
            "stream.replayed",
            start=start,
            first=report.first_seq,
            last=report.last_seq,
            batches=report.batches,
            attempts=report.attempts,
            seconds=round(report.seconds, 4),
        )
        return report

    async def _fetch_when_possible(self, start: int) -> ReplayReport:
        """A replay, waiting out a resource limit on its socket: batches the publisher still
        buffers are not lost because this process had no socket to ask for them."""
        assert self._replay is not None
        while True:
            try:
                report = await self._replay.fetch(start, self._deliver)
            except ResourceError as exc:
                await self._wait_out(exc)
                continue
            self._resourced()
            return report

    async def _deliver(self, seq: int, payload: bytes) -> bool:
        return await self._offer(seq, payload, _Mode.REPLAY)

    async def _lose(self, batches: int, detail: str, *, flag_entries: bool) -> None:
        """The stale policy's start: DEGRADED, and flag what the lost batches may have removed."""
        self.counters.batches_lost += batches
        deadline = None
        if flag_entries:
            flagged = await self._gate.mark_unconfirmed(self.worker)
            ttl = self._options.unconfirmed_ttl
            deadline = time.monotonic() + ttl
            detail += f"; {flagged} entries unconfirmed, dropped in {ttl:g}s unless reconfirmed"
        self.health.lose(batches, detail, stale_deadline=deadline)
        self._log.warning("stream.batches_lost", batches=batches, detail=detail)

    async def _drop_stale(self) -> None:
        dropped = await self._gate.drop_unconfirmed(self.worker)
        self.counters.unconfirmed_dropped += dropped
        self.health.stale_dropped(dropped)
        self._log.warning("stream.unconfirmed_dropped", entries=dropped)

    async def _learn_rank(self, rank: int) -> bool:
        """Take the rank a batch names as this stream's worker, if nothing was applied yet."""
        if self._applied_any:
            return False
        assumed = self.worker
        self.worker = WorkerKey(self.spec.pod, rank)
        self.counters.worker = str(self.worker)
        self._log = log.bind(pod=self.spec.pod, worker=str(self.worker), dp_rank=rank)
        self._fence = self._stored = await self._gate.fence(self.worker)
        self._forget = assumed
        self.health.changed.set()
        self._log.info("stream.worker_rank", assumed=str(assumed))
        return True

    # -- accounting -----------------------------------------------------------------------

    def _drop(self, reason: DropReason) -> None:
        drops = self.counters.drops
        count = drops[reason] = drops.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._drop_logged.get(reason, -DROP_LOG_SECONDS) >= DROP_LOG_SECONDS:
            self._drop_logged[reason] = now
            self._log.warning("stream.drop", reason=reason.value, count=count)

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
        applied = None if self._fence is None else self._fence.seq
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


def _block_events(batch: Batch) -> int:
    return sum(
        len(e.block_hashes) for e in batch.events if isinstance(e, EntriesStored | EntriesRemoved)
    )


def _clears(batch: Batch) -> bool:
    return any(isinstance(e, WorkerCleared) for e in batch.events)


def _seq_of(frames: list[bytes] | None) -> int | None:
    if frames is None or len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
        return None
    return int.from_bytes(frames[1], "big")
