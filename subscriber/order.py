"""The order-and-repair rules of one worker's stream: a state machine, inputs in, decisions out.

Imports the store model only; no zmq, no asyncio, no store calls, no clock. `stream.py` feeds
it what happened (a batch placed live or by replay, a replay ended or failed, the store lost
the index, an audit read the store's fence) and executes what it decides (store, skip, stop a
replay, repair by replay first, show a loss). subscriber/README.md explains each rule.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvsi.store.model import ApplyOutcome, Fence, advance, decide, fell_behind

LOST_INDEX = "the index store lost this worker's index"
"""How a worker's state detail starts while (or after) rebuilding from replay."""


class Mode(enum.Enum):
    """Where a batch comes from, which decides what a gap before it means."""

    LIVE = "live"
    """A live message: a gap before it is repaired by replay first."""
    REPLAY = "replay"
    """A replayed batch: a gap before it means the publisher's buffer no longer reaches."""
    REPAIRED = "repaired"
    """A live message after its repair: a gap still before it is lost for good."""


@dataclass(frozen=True, slots=True)
class Gap:
    """Seqs `expected..got-1` were missed (counted and logged once, where first seen)."""

    expected: int
    got: int


@dataclass(frozen=True, slots=True)
class Loss:
    """Batches lost for good: the worker shows DEGRADED with `detail`.

    `flag_entries`: what the lost batches may have removed is flagged unconfirmed (the
    stale policy); not after a restart, whose new engine started empty.
    """

    batches: int
    detail: str
    flag_entries: bool


@dataclass(frozen=True, slots=True)
class Apply:
    """Store the batch (the fence already stands after it): `lost_before` shown first,
    `lost_after` once it is stored. RESTARTED: the store empties the worker first."""

    outcome: ApplyOutcome
    gap: Gap | None = None
    lost_before: Loss | None = None
    lost_after: Loss | None = None


@dataclass(frozen=True, slots=True)
class Skip:
    """Not stored: counted under `outcome` (None: a repeat of an unusable batch)."""

    outcome: ApplyOutcome | None


@dataclass(frozen=True, slots=True)
class Repair:
    """Catch up by replay first (`why` says what asked), then place the batch again as
    REPAIRED. `gap` None: an engine restart seen late, never a gap."""

    why: str
    gap: Gap | None


@dataclass(frozen=True, slots=True)
class Lose:
    """An unusable batch: its seq is consumed (the fence stands on it), `loss` shown."""

    loss: Loss


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop the running replay: it cannot help (a restarted engine; `catch_up` asks from 0)."""


Decision = Apply | Skip | Repair | Lose | Stop

APPLY = Apply(ApplyOutcome.APPLIED)
"""The next seq of the same engine: the hot path's decision, one shared instance."""
STOP = Stop()
_SKIPS = {outcome: Skip(outcome) for outcome in ApplyOutcome} | {None: Skip(None)}


@dataclass(frozen=True, slots=True)
class AfterReplay:
    """What the end of a catch-up's replay asks for."""

    stale: bool = False
    """The store lost the index meanwhile: stop here, the next catch-up rebuilds from 0."""
    loss: Loss | None = None
    """A lost index that the replay from seq 0 could not rebuild."""
    from_zero: bool = False
    """The engine was replaced: replay again from seq 0, where its history begins."""


class StreamOrder:
    """One worker's fence, as this stream moved it, and the state of its repairs.

    `fence` mirrors the store's fence as this stream's decisions move it (before the store
    call: a backlog's run is classified ahead of its one store call), so duplicates,
    previous-engine batches, gaps and restarts are told apart without a store round trip.
    `stored` is a lower bound of the fence the store was seen to hold: a store behind it lost
    the worker's index (Redis back without its data, or the worker removed).
    """

    def __init__(self) -> None:
        self.fence: Fence | None = None
        self.stored: Fence | None = None
        self.applied: int | None = None
        """The last seq stored (or consumed unusable): `fence` without the batches decided
        and not stored yet; what the lag gauges count from."""
        self.rebuild_from: int | None = None
        """While rebuilding a lost index: the last seq the lost index held (-1: none)."""
        self.resync = False
        """A catch-up is due (the publisher connected, or the index was lost)."""
        self.repair_failure: str | None = None
        """Why the last catch-up could not replay, if it could not."""
        self.losses = 0
        """Indexes lost so far: a catch-up that saw this change stops (see `replayed`)."""
        self._replay_start = 0
        self._restart_seen = False
        self._catch_up_losses = 0

    def load(self, fence: Fence | None) -> None:
        """The store's fence at start (or for a newly learned worker key): resume there."""
        self.fence = self.stored = fence
        self.applied = None if fence is None else fence.seq

    @property
    def may_group(self) -> bool:
        """Whether a backlog may be classified in runs now (no catch-up or rebuild pending)."""
        return not self.resync and self.rebuild_from is None

    # -- batches ----------------------------------------------------------------------------

    def follows(self, seq: int, ts: float) -> bool:
        """The very next batch of the same engine: True, and the fence stands after it."""
        fence = self.fence
        if fence is None:
            if seq != 0:
                return False
        elif seq != fence.seq + 1 or decide(fence, seq, ts) is not ApplyOutcome.APPLIED:
            return False
        self.fence = advance(fence, ApplyOutcome.APPLIED, seq, ts)
        return True

    def place(self, seq: int, ts: float, mode: Mode) -> Decision:
        """The order decision for a readable batch with a finite `ts`."""
        if self.follows(seq, ts):
            return APPLY
        fence = self.fence
        outcome = decide(fence, seq, ts)
        if outcome is ApplyOutcome.APPLIED:
            return self._gap(seq, ts, 0 if fence is None else fence.seq + 1, mode)
        if outcome is ApplyOutcome.RESTARTED:
            if seq == 0:
                self.fence = advance(fence, outcome, seq, ts)
                return Apply(outcome)
            return self._restart_gap(seq, ts, mode)
        # DUPLICATE (held live messages a replay already applied) or PREVIOUS_ENGINE.
        return _SKIPS[outcome]

    def _gap(self, seq: int, ts: float, expected: int, mode: Mode) -> Decision:
        gap = None if mode is Mode.REPAIRED else Gap(expected, seq)
        if mode is Mode.LIVE:
            return Repair(f"gap before seq {seq}", gap)
        detail = f"seqs {expected}..{seq - 1} lost: {self._why(seq, mode)}"
        if self.rebuild_from is not None:
            detail = f"{LOST_INDEX}; {detail}"
        self.fence = advance(self.fence, ApplyOutcome.APPLIED, seq, ts)
        return Apply(ApplyOutcome.APPLIED, gap, lost_before=Loss(seq - expected, detail, True))

    def _restart_gap(self, seq: int, ts: float, mode: Mode) -> Decision:
        """A new engine whose first batches (0..seq-1) we have not seen."""
        if mode is Mode.LIVE:
            return Repair(f"engine restart seen at seq {seq}", None)
        if mode is Mode.REPLAY and self._replay_start > 0:
            self._restart_seen = True  # `replayed` asks again from seq 0
            return STOP
        self.fence = advance(self.fence, ApplyOutcome.RESTARTED, seq, ts)
        # The new engine started empty: what we lack are its first stores, nothing stale to
        # flag. The worker under-reports until they are evicted or reported again.
        detail = f"engine restarted; its seqs 0..{seq - 1} lost: {self._why(seq, mode)}"
        return Apply(ApplyOutcome.RESTARTED, lost_after=Loss(seq, detail, False))

    def _why(self, seq: int, mode: Mode) -> str:
        if mode is Mode.REPLAY:
            return f"the publisher's replay buffer starts at seq {seq}"
        return self.repair_failure or "replay did not return them"

    def unusable(self, seq: int, detail: str, mode: Mode) -> Decision:
        """A batch that cannot be applied (unreadable, wrong rank, a ts not finite).

        Its seq still counts, else the next batch would look like a gap whose replay returns
        the same bad batch again.
        """
        fence = self.fence
        if fence is not None and seq <= fence.seq:
            return _SKIPS[None]  # a repeat, or a new engine's: without a time, no telling
        expected = 0 if fence is None else fence.seq + 1
        if seq > expected and mode is Mode.LIVE:
            return Repair(f"gap before seq {seq}", Gap(expected, seq))
        lost = seq - expected + 1
        self.fence = (
            Fence(seq, 0.0, 0.0) if fence is None else Fence(seq, fence.epoch_ts, fence.last_ts)
        )
        self.applied = seq
        if lost > 1:
            detail += f"; seqs {expected}..{seq - 1} before it lost too"
        return Lose(Loss(lost, detail, True))

    # -- what the store did -------------------------------------------------------------------

    def not_stored(self, seq: int, why: str) -> Loss:
        """A batch decided and placed, then given up: the store raised on every try. It is
        consumed as an unusable one is (the fence already stands after it, `stored` stays
        where the store's is) and lost, with what it may have removed flagged."""
        self.applied = seq
        return Loss(1, f"batch seq {seq} could not be applied ({why})", True)

    def stored_outcome(self, outcome: ApplyOutcome, seq: int, ts: float) -> bool:
        """Move `stored` as the store's own outcome moved its fence; True: read the store's
        fence instead (no bound yet: nothing was stored when the stream started).

        The store's outcome, not this stream's: the two fences differ after an unusable
        batch. DUPLICATE or PREVIOUS_ENGINE: the store is ahead, the bound stays.
        """
        self.applied = seq
        if self.stored is None:
            return True
        if outcome is ApplyOutcome.APPLIED or outcome is ApplyOutcome.RESTARTED:
            self.stored = advance(self.stored, outcome, seq, ts)
        return False

    def audit(self, stored: Fence | None) -> bool:
        """The store's fence read by the audit: True if it fell behind `stored` (lost)."""
        return fell_behind(stored, self.stored)

    def index_lost(self) -> int:
        """The store lost the worker's index: forget the fence, rebuild by replay from seq 0.
        Returns the last seq the lost index held (-1: none)."""
        held = -1 if self.fence is None else self.fence.seq
        self.rebuild_from = max(held, -1 if self.rebuild_from is None else self.rebuild_from)
        self.fence = self.stored = self.applied = None
        self.losses += 1
        self.resync = True
        return held

    # -- catch-up -----------------------------------------------------------------------------

    def catch_up(self) -> int:
        """A catch-up begins: the seq to replay from, the last applied (0 without one).

        Asking from the last applied seq, not the one after, checks the engine: the same
        engine returns that batch again (a duplicate); a restarted one returns nothing there,
        or a newer batch under that seq (see `replayed`).
        """
        self.resync = False
        self.repair_failure = None
        self._restart_seen = False
        self._catch_up_losses = self.losses
        return 0 if self.fence is None else self.fence.seq

    def without_replay(self) -> Loss | None:
        """The catch-up cannot replay (no endpoint): a rebuild in progress fails with a loss."""
        self.repair_failure = "no replay endpoint is configured"
        return self._rebuilt(replayed=False)

    def replay_begins(self, start: int) -> None:
        """A replay from `start` runs: a restart seen in it stops it if `start` > 0."""
        self._replay_start = start

    def replay_failed(self, why: str) -> None:
        """Every attempt of the replay failed (`why`: the last failure)."""
        self.repair_failure = why

    def replayed(self, start: int, batches: int | None) -> AfterReplay:
        """The catch-up's replay from `start` ended with `batches` (None: it failed)."""
        if self.losses != self._catch_up_losses:
            return AfterReplay(stale=True)
        loss = self._rebuilt(batches is not None) if start == 0 else None
        replaced = batches is not None and start > 0 and (self._restart_seen or batches == 0)
        return AfterReplay(loss=loss, from_zero=replaced)

    def _rebuilt(self, replayed: bool) -> Loss | None:
        """After the replay from seq 0 that rebuilds a lost index: the loss, if it failed.

        A replay that starts after seq 0 was shown by `_gap`; one that returns nothing means
        a publisher without history (a new engine): it holds nothing, and neither do we.
        """
        held, self.rebuild_from = self.rebuild_from, None
        if held is None or replayed or held < 0:
            return None
        detail = f"{LOST_INDEX}; seqs 0..{held} not rebuilt: {self.repair_failure}"
        return Loss(held + 1, detail, False)
