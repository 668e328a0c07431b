"""The data path of one stream: decode each batch, ask the order rules, do what they decide.

Imports the store contract and replay.py (zmq through it); never the API, never a socket of
its own. stream.py hands it live messages from its inbox; it stores batches through gate.py
(`_store`, the one path of every batch to the store), repairs by replay (replay.py) what
the rules (order.py) say is missing, and shows losses through health.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable

import structlog
from structlog.typing import FilteringBoundLogger

from kvsi import tracing
from kvsi.store.model import (
    CLEARED,
    ApplyOutcome,
    Batch,
    IndexLostError,
    StoreEvent,
    WorkerKey,
)
from kvsi.subscriber import metrics
from kvsi.subscriber.decode import Decoded, ingest_decoder
from kvsi.subscriber.drops import DropReason
from kvsi.subscriber.framing import parse_live
from kvsi.subscriber.gate import StoreGate, UnappliableError
from kvsi.subscriber.health import WorkerHealth
from kvsi.subscriber.order import (
    LOST_INDEX,
    Apply,
    Decision,
    Gap,
    Lose,
    Loss,
    Mode,
    Repair,
    Skip,
    StreamOrder,
)
from kvsi.subscriber.replay import ReplayClient, ReplayFailedError, ReplayReport
from kvsi.subscriber.sockets import ResourceError

log = structlog.get_logger(__name__)

RUN_MAX = 16
"""Most live batches handed to the store at once: the messages held back to back that
simply follow the fence. A Redis script runs them in one go (`store.redis.store.CALL_MAX`)
and other clients wait while it does; the memory store applies them without a yield: the
bound keeps both pauses short, and a live batch's wait for the rest of its run."""

REPLAY_RUN_MAX = 64
"""Most replayed batches handed to the store at once: a replay is a backlog to get through,
not a feed to keep fresh. The Redis store writes such a run as calls of `CALL_MAX`, each
planned while Redis runs the one before (three of a run's four calls overlap one)."""

DROP_LOG_SECONDS = 10.0
"""At most one log line per drop reason per stream in this time (with the running count):
a publisher sending garbage must not flood the logs; the counters still count every drop."""


class Applier:
    """Applies one worker's batches in seq order: the only writer of its batches.

    Keeps the worker's key (its rank is the spec's until a batch names one) and the order
    rules' state (`order`); executes their decisions against the store and the replay
    endpoint. Runs inside the stream's applier task: one call at a time.
    """

    def __init__(
        self,
        worker: WorkerKey,
        gate: StoreGate,
        health: WorkerHealth,
        counters: metrics.WorkerCounters,
        *,
        replay: ReplayClient | None,
        unconfirmed_ttl: float,
        tokens_hashes: bool = False,
        wake: Callable[[], None],
        wait_out: Callable[[ResourceError], Awaitable[None]],
        resourced: Callable[[], None],
    ) -> None:
        """`replay`: None without a replay endpoint. `tokens_hashes`: decode stores with
        Dynamo's hashes of their tokens (`decode.ingest_decoder`). `wake`: wakes the applier task (a
        catch-up is due). `wait_out`, `resourced`: the stream's handling of a resource limit
        on a replay's socket."""
        self.worker = worker
        self.order = StreamOrder()
        self.health = health
        self.counters = counters
        self.log: FilteringBoundLogger = log.bind(
            pod=worker.pod, worker=str(worker), dp_rank=worker.dp_rank
        )
        self.forget: WorkerKey | None = None
        """An assumed worker key replaced by the rank a batch named: the status writer
        removes it if nothing was applied under it."""
        self._gate = gate
        self._decoder = ingest_decoder(tokens=tokens_hashes)
        self._replay = replay
        self._unconfirmed_ttl = unconfirmed_ttl
        self._wake = wake
        self._wait_out = wait_out
        self._resourced = resourced
        self._applied_any = False
        self._drop_logged: dict[DropReason, float] = {}
        self._replayed: list[Batch] = []
        """Replayed batches that follow the fence, held to be stored as one run."""
        self._given_up: int | None = None
        """The seq of the last batch given up (`_unappliable`): lost, not stored."""

    async def on_live(self, messages: list[list[bytes]]) -> None:
        """Live messages held back to back: runs of clean batches that simply follow the
        fence go to the store together (one call: one Redis script for the run); any other
        message is decided alone, after the run before it is stored."""
        run: list[Batch] = []
        decode = self._decoder.decode
        self.counters.messages += len(messages)
        for frames in messages:
            parsed = parse_live(frames)
            if isinstance(parsed, DropReason):
                self.drop(parsed)
                continue
            seq, payload = parsed
            decoded = decode(payload)
            if self._follows(seq, decoded):
                run.append(Batch(seq, decoded.ts, decoded.events))
                continue
            if run:
                await self._store(run, Mode.LIVE)
                run = []
            await self._accept(seq, decoded, Mode.LIVE)
        if run:
            await self._store(run, Mode.LIVE)

    def _follows(self, seq: int, decoded: Decoded[StoreEvent]) -> bool:
        """A clean batch that simply follows the fence (which then stands after it): stored
        in a run with its neighbours, the rules' other decisions not needed."""
        return (
            decoded.ok
            and not decoded.dropped
            and math.isfinite(decoded.ts)
            and decoded.data_parallel_rank in (None, self.worker.dp_rank)
            and self.order.follows(seq, decoded.ts)
        )

    async def _deliver(self, seq: int, payload: bytes) -> bool:
        """A replayed batch; False stops the replay. Batches that simply follow the fence
        are held and stored in runs of up to REPLAY_RUN_MAX, as live ones are in theirs
        (`_store_replayed` stores what is held when the replay ends)."""
        decoded = self._decoder.decode(payload)
        if self._follows(seq, decoded):
            self._replayed.append(Batch(seq, decoded.ts, decoded.events))
            return len(self._replayed) < REPLAY_RUN_MAX or await self._store_replayed()
        return await self._store_replayed() and await self._accept(seq, decoded, Mode.REPLAY)

    async def _store_replayed(self) -> bool:
        """Store the replayed batches held (their fence already stands); False: the store
        lost the worker's index (the replay stops)."""
        run, self._replayed = self._replayed, []
        return not run or await self._store(run, Mode.REPLAY)

    async def _accept(self, seq: int, decoded: Decoded[StoreEvent], mode: Mode) -> bool:
        """Check a decoded batch, have the rules decide, do what they say; False asks a
        running replay to stop."""
        for reason in decoded.dropped:
            self.drop(reason)
        unusable = await self._unusable(seq, decoded)
        decision = self._decide(seq, decoded.ts, unusable, mode)
        if type(decision) is Repair:
            await self._repair(decision, seq, decoded.ts)
            decision = self._decide(seq, decoded.ts, unusable, Mode.REPAIRED)
        return await self._execute(decision, seq, decoded, mode)

    async def _unusable(self, seq: int, decoded: Decoded[StoreEvent]) -> str | None:
        """Why the batch cannot be applied (counted as a drop), or None."""
        if not decoded.ok:
            why = decoded.dropped[0].value if decoded.dropped else "unreadable"
            return f"batch seq {seq} unreadable ({why})"
        if not math.isfinite(decoded.ts):
            # NaN never compares: one such ts in the fence would hide every later restart.
            self.drop(DropReason.MALFORMED_BATCH)
            return f"batch seq {seq} has ts {decoded.ts}"
        rank = decoded.data_parallel_rank
        if rank is not None and rank != self.worker.dp_rank and not await self._learn_rank(rank):
            self.drop(DropReason.RANK_MISMATCH)
            return f"batch seq {seq} names data_parallel_rank {rank}, not {self.worker}"
        return None

    def _decide(self, seq: int, ts: float, unusable: str | None, mode: Mode) -> Decision:
        if unusable is None:
            return self.order.place(seq, ts, mode)
        return self.order.unusable(seq, unusable, mode)

    async def _execute(
        self, decision: Decision, seq: int, decoded: Decoded[StoreEvent], mode: Mode
    ) -> bool:
        """Do what the rules decided for one batch; False asks a running replay to stop."""
        if type(decision) is Skip:
            if decision.outcome is not None:
                batches = self.counters.batches
                batches[decision.outcome] = batches.get(decision.outcome, 0) + 1
            return True
        if type(decision) is Lose:
            await self._lose(decision.loss)
            return True
        if type(decision) is not Apply:
            return False  # Stop
        if decision.gap is not None:
            self._count_gap(decision.gap, mode)
        if decision.lost_before is not None:
            await self._lose(decision.lost_before)
        self._given_up = None
        if not await self._store([Batch(seq, decoded.ts, decoded.events)], mode):
            return False  # a replay stops; the rebuild replays from seq 0
        if decision.outcome is ApplyOutcome.RESTARTED and self._given_up != seq:
            # The store emptied the worker first: not a gap, and nothing stale is left.
            self.counters.restarts += 1
            self.log.warning("stream.engine_restart", seq=seq, ts=decoded.ts)
            self.health.exact_again()
        if decision.lost_after is not None:
            await self._lose(decision.lost_after)
        return True

    async def _store(self, run: list[Batch], mode: Mode) -> bool:
        """The one way batches reach the store (the fence already stands after them);
        False: the store lost the worker's index and refused them. One span per call while
        tracing is on (kvsi.tracing)."""
        traced = tracing.tracer()
        if traced is None:
            return await self._apply(run, mode)
        attributes: dict[str, str | int] = {
            "kvsi.worker": str(self.worker),
            "kvsi.seq": run[0].seq,
            "kvsi.batches": len(run),
            "kvsi.mode": mode.value,
        }
        with traced.start_as_current_span("kvsi.apply", attributes=attributes) as span:
            applied = await self._apply(run, mode)
            span.set_attribute("kvsi.applied", applied)
            return applied

    async def _apply(self, run: list[Batch], mode: Mode) -> bool:
        started = time.perf_counter()
        gate = self._gate
        try:
            if len(run) == 1:
                outcomes = [await gate.apply(self.worker, run[0], self.order.stored)]
            else:
                outcomes = await gate.apply_many(self.worker, run, self.order.stored)
        except IndexLostError as exc:
            await self._index_lost(str(exc))
            return False
        except UnappliableError as exc:
            return await self._unappliable(run, mode, exc)
        metrics.APPLY_SECONDS.observe(time.perf_counter() - started)
        if mode is not Mode.REPLAY:
            _observe_delay(run)
        counters = self.counters
        batches = counters.batches
        health = self.health
        order = self.order
        block_events = 0
        for batch, stored in zip(run, outcomes, strict=True):
            batches[stored] = batches.get(stored, 0) + 1
            block_events += _block_events(batch)
            if order.stored_outcome(stored, batch.seq, batch.ts):
                order.stored = await gate.fence(self.worker)
            if health.degraded and _clears(batch):
                health.exact_again()
        counters.block_events += block_events
        self._applied_any = True
        if mode is Mode.REPLAY:
            counters.batches_replayed += len(run)
        return True

    async def _unappliable(self, run: list[Batch], mode: Mode, exc: UnappliableError) -> bool:
        """The store raised one programming error on every try of `run`: a run goes again
        batch by batch (what landed of it comes back a duplicate), so that only a batch that
        raises alone is given up. That one is counted (`apply_error`) and lost as a gap
        replay cannot fill is: DEGRADED, what it may have removed flagged unconfirmed; the
        stream goes on with the next."""
        if len(run) > 1:
            for batch in run:
                if not await self._apply([batch], mode):
                    return False
            return True
        seq = self._given_up = run[0].seq
        self.drop(DropReason.APPLY_ERROR)
        self.log.error("stream.batch_unappliable", seq=seq, error=str(exc), exc_info=exc.__cause__)
        await self._lose(self.order.not_stored(seq, str(exc)))
        return True

    def _count_gap(self, gap: Gap, mode: Mode) -> None:
        self.counters.gaps += 1
        self.counters.batches_missed += gap.got - gap.expected
        self.log.warning("stream.gap", expected=gap.expected, got=gap.got, mode=mode.value)

    # -- repair -------------------------------------------------------------------------

    async def _repair(self, repair: Repair, seq: int, ts: float) -> None:
        """What a live batch revealed missing, recovered by replay before it is placed."""
        if repair.gap is None:
            self.log.warning("stream.engine_restart_detected", got=seq, ts=ts)
        else:
            self._count_gap(repair.gap, Mode.LIVE)
        await self.catch_up(repair.why)

    async def catch_up(self, why: str) -> None:
        """Replay from where the rules say (`StreamOrder.catch_up`) and apply what comes back."""
        order = self.order
        start = order.catch_up()
        if self._replay is None:
            loss = order.without_replay()
            if loss is not None:
                await self._lose(loss)
            self.health.repairing(None)
            self.health.synced()
            return
        if self.health.repairing_detail is not None:
            # Batches we dropped ourselves: the worker shows as degraded (repairing) in the
            # store before the repair starts, however short it turns out to be.
            await self.health.until_stored()
        self.log.info("stream.catch_up", why=why, start=start)
        report = await self._fetch(start)
        after = order.replayed(start, None if report is None else report.batches)
        if after.stale:
            return  # the store lost the index meanwhile: the next round rebuilds from seq 0
        if after.loss is not None:
            await self._lose(after.loss)
        if after.from_zero:
            self.log.warning("stream.engine_replaced", last_applied=start)
            again = await self._fetch(0)
            if again is not None and again.batches == 0:
                # A restarted engine with nothing published yet: it holds nothing, so must we.
                await self._gate.clear_worker(self.worker)
                self.health.exact_again()
        self.health.repairing(None)
        if not order.resync:  # a connect since this catch-up began asks for another
            self.health.synced()

    async def _index_lost(self, detail: str) -> None:
        """The store lost this worker's index: the rules forget the fence and ask for a
        rebuild by replay from seq 0.

        DEGRADED (repairing) until the replay from seq 0 is applied; if the publisher's
        buffer no longer reaches seq 0, or there is no replay, the missing seqs are lost for
        good and shown as such: the worker under-reports, never silently.
        """
        held = self.order.index_lost()
        self.counters.index_lost += 1
        self.log.error("stream.index_lost", error=detail, last_seq=held)
        self.health.repairing(f"{LOST_INDEX} ({detail}); rebuilding it by replay from seq 0")
        self._wake()

    async def _fetch(self, start: int) -> ReplayReport | None:
        assert self._replay is not None
        self.order.replay_begins(start)
        counters = self.counters
        try:
            report = await self._fetch_when_possible(start)
        except ReplayFailedError as exc:
            await self._store_replayed()
            counters.replays["failed"] = counters.replays.get("failed", 0) + 1
            counters.replay_failures[exc.reason] = counters.replay_failures.get(exc.reason, 0) + 1
            self.order.replay_failed(str(exc))
            self.log.warning("stream.replay_failed", start=start, reason=exc.reason, error=str(exc))
            return None
        await self._store_replayed()
        result = "stopped" if report.stopped else "complete"
        counters.replays[result] = counters.replays.get(result, 0) + 1
        self.log.info(
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

    async def _lose(self, loss: Loss) -> None:
        """The stale policy's start: DEGRADED, and flag what the lost batches may have removed."""
        self.counters.batches_lost += loss.batches
        detail = loss.detail
        deadline = None
        if loss.flag_entries:
            flagged = await self._gate.mark_unconfirmed(self.worker)
            ttl = self._unconfirmed_ttl
            deadline = time.monotonic() + ttl
            detail += f"; {flagged} entries unconfirmed, dropped in {ttl:g}s unless reconfirmed"
        self.health.lose(loss.batches, detail, stale_deadline=deadline)
        self.log.warning("stream.batches_lost", batches=loss.batches, detail=detail)

    async def drop_stale(self) -> None:
        """The stale policy's end: what no event reconfirmed since the loss is removed."""
        dropped = await self._gate.drop_unconfirmed(self.worker)
        self.counters.unconfirmed_dropped += dropped
        self.health.stale_dropped(dropped)
        self.log.warning("stream.unconfirmed_dropped", entries=dropped)

    async def _learn_rank(self, rank: int) -> bool:
        """Take the rank a batch names as this stream's worker, if nothing was applied yet."""
        if self._applied_any:
            return False
        assumed = self.worker
        self.worker = WorkerKey(assumed.pod, rank)
        self.counters.worker = str(self.worker)
        self.log = log.bind(pod=assumed.pod, worker=str(self.worker), dp_rank=rank)
        self.order.load(await self._gate.fence(self.worker))
        self.forget = assumed
        self.health.changed.set()
        self.log.info("stream.worker_rank", assumed=str(assumed))
        return True

    def drop(self, reason: DropReason) -> None:
        """Count a skipped input by reason; log it at most every DROP_LOG_SECONDS."""
        drops = self.counters.drops
        count = drops[reason] = drops.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._drop_logged.get(reason, -DROP_LOG_SECONDS) >= DROP_LOG_SECONDS:
            self._drop_logged[reason] = now
            self.log.warning("stream.drop", reason=reason.value, count=count)

    async def audit(self) -> None:
        """Whether the store still holds what this stream stored: a fence behind the one
        seen stored is a lost index, rebuilt now (an idle engine sends nothing that would
        reveal a store that came back empty)."""
        stored = await self._gate.fence(self.worker)
        if self.order.audit(stored):
            where = "no fence" if stored is None else f"fence seq {stored.seq}"
            await self._index_lost(f"the store holds {where}, behind what it held before")


def _block_events(batch: Batch) -> int:
    """Block hashes the batch names (stored plus removed), for `kvsi_block_events_total`."""
    count = 0
    for event in batch.events:
        count += len(event.block_hashes)
    return count


def _clears(batch: Batch) -> bool:
    return any(e.kind == CLEARED for e in batch.events)


def _observe_delay(run: list[Batch]) -> None:
    """Each live batch's delay from its engine time to now, into `kvsi_index_delay_seconds`."""
    now = time.time()
    observe = metrics.INDEX_DELAY_SECONDS.observe
    for batch in run:
        observe(max(0.0, now - batch.ts))
