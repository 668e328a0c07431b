"""The stream's order-and-repair rules (subscriber/order.py), by tables: no sockets, no loop.

Each row sets a `StreamOrder` up, gives it one input and checks the decision and the state
after it. tests/subscriber/test_gap_repair.py and test_replay.py drive the same rules over
real sockets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kvsi.store.model import ApplyOutcome, Fence
from kvsi.subscriber.order import (
    APPLY,
    LOST_INDEX,
    STOP,
    AfterReplay,
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

AT_10 = Fence(seq=10, epoch_ts=100.0, last_ts=110.0)
"""An engine whose epoch began at 100.0, last applied seq 10 at 110.0."""

LIVE, REPLAY, REPAIRED = Mode.LIVE, Mode.REPLAY, Mode.REPAIRED
BUFFER_AT_15 = "the publisher's replay buffer starts at seq 15"


@dataclass
class Given:
    """A StreamOrder's state before the input."""

    fence: Fence | None = AT_10
    rebuild_from: int | None = None
    repair_failure: str | None = None
    replay_start: int = 0

    def order(self) -> StreamOrder:
        order = StreamOrder()
        order.load(self.fence)
        order.rebuild_from = self.rebuild_from
        order.replay_begins(self.replay_start)
        order.repair_failure = self.repair_failure
        return order


@dataclass
class Row:
    given: Given
    seq: int
    ts: float
    mode: Mode
    decision: Decision
    fence: Fence | None = field(default=None)
    """The fence after; None: unchanged."""


PLACE = {
    "the first batch of a new worker is applied": Row(
        Given(fence=None), 0, 5.0, LIVE, APPLY, Fence(0, 5.0, 5.0)
    ),
    "the next seq is applied": Row(Given(), 11, 120.0, LIVE, APPLY, Fence(11, 100.0, 120.0)),
    "the next seq with an older time than the last is applied, the last time kept": Row(
        Given(), 11, 105.0, REPLAY, APPLY, Fence(11, 100.0, 110.0)
    ),
    "a batch older than the engine's epoch is a previous engine's": Row(
        Given(), 11, 99.0, LIVE, Skip(ApplyOutcome.PREVIOUS_ENGINE)
    ),
    "the last seq again is a duplicate": Row(
        Given(), 10, 110.0, LIVE, Skip(ApplyOutcome.DUPLICATE)
    ),
    "an older seq, no newer time, is a duplicate (a held message a replay applied)": Row(
        Given(), 7, 104.0, REPAIRED, Skip(ApplyOutcome.DUPLICATE)
    ),
    "seq 0 with a newer time is an engine restart, applied": Row(
        Given(), 0, 200.0, LIVE, Apply(ApplyOutcome.RESTARTED), Fence(0, 200.0, 200.0)
    ),
    "a live gap is repaired by replay first": Row(
        Given(), 15, 120.0, LIVE, Repair("gap before seq 15", Gap(11, 15))
    ),
    "a live gap before any fence is repaired from seq 0": Row(
        Given(fence=None), 3, 5.0, LIVE, Repair("gap before seq 3", Gap(0, 3))
    ),
    "a replayed gap: the buffer no longer reaches, lost, shown before the apply": Row(
        Given(replay_start=11),
        15,
        120.0,
        REPLAY,
        Apply(
            ApplyOutcome.APPLIED,
            Gap(11, 15),
            lost_before=Loss(4, f"seqs 11..14 lost: {BUFFER_AT_15}", True),
        ),
        Fence(15, 100.0, 120.0),
    ),
    "a gap still there after its repair: lost with why the replay failed, not counted again": Row(
        Given(repair_failure="replay timed out"),
        15,
        120.0,
        REPAIRED,
        Apply(
            ApplyOutcome.APPLIED,
            None,
            lost_before=Loss(4, "seqs 11..14 lost: replay timed out", True),
        ),
        Fence(15, 100.0, 120.0),
    ),
    "a gap after a repair that replayed without reaching it": Row(
        Given(),
        15,
        120.0,
        REPAIRED,
        Apply(
            ApplyOutcome.APPLIED,
            None,
            lost_before=Loss(4, "seqs 11..14 lost: replay did not return them", True),
        ),
        Fence(15, 100.0, 120.0),
    ),
    "a replayed gap while rebuilding a lost index says so": Row(
        Given(fence=None, rebuild_from=20),
        15,
        120.0,
        REPLAY,
        Apply(
            ApplyOutcome.APPLIED,
            Gap(0, 15),
            lost_before=Loss(15, f"{LOST_INDEX}; seqs 0..14 lost: {BUFFER_AT_15}", True),
        ),
        Fence(15, 120.0, 120.0),
    ),
    "a live restart seen late (seq > 0) is repaired first, never a gap": Row(
        Given(), 5, 200.0, LIVE, Repair("engine restart seen at seq 5", None)
    ),
    "a restart seen in a replay from seq > 0 stops it (False stops the replay)": Row(
        Given(replay_start=10), 5, 200.0, REPLAY, STOP
    ),
    "a restart seen in the replay from seq 0: its first seqs are lost, shown after": Row(
        Given(replay_start=0),
        5,
        200.0,
        REPLAY,
        Apply(
            ApplyOutcome.RESTARTED,
            lost_after=Loss(
                5,
                "engine restarted; its seqs 0..4 lost: "
                "the publisher's replay buffer starts at seq 5",
                False,
            ),
        ),
        Fence(5, 200.0, 200.0),
    ),
    "a restart still late after its repair: its first seqs lost with the replay's failure": Row(
        Given(repair_failure="no replay endpoint is configured"),
        5,
        200.0,
        REPAIRED,
        Apply(
            ApplyOutcome.RESTARTED,
            lost_after=Loss(
                5, "engine restarted; its seqs 0..4 lost: no replay endpoint is configured", False
            ),
        ),
        Fence(5, 200.0, 200.0),
    ),
}


@pytest.mark.parametrize("row", PLACE.values(), ids=PLACE.keys())
def test_place(row: Row) -> None:
    order = row.given.order()
    before = order.fence

    assert order.place(row.seq, row.ts, row.mode) == row.decision
    assert order.fence == (row.fence or before)
    assert order.applied == (None if before is None else before.seq), "decided, not stored yet"


UNUSABLE = {
    "a repeat of a consumed seq is skipped, uncounted": Row(Given(), 10, 0.0, LIVE, Skip(None)),
    "an older seq is skipped too: without a time, no telling": Row(
        Given(), 3, 0.0, REPLAY, Skip(None)
    ),
    "the next seq unusable: consumed, lost, its entries flagged": Row(
        Given(), 11, 0.0, LIVE, Lose(Loss(1, "bad", True)), Fence(11, 100.0, 110.0)
    ),
    "a live gap before an unusable batch is repaired first": Row(
        Given(), 13, 0.0, LIVE, Repair("gap before seq 13", Gap(11, 13))
    ),
    "a replayed unusable batch after a gap: the seqs before it are lost with it": Row(
        Given(),
        13,
        0.0,
        REPLAY,
        Lose(Loss(3, "bad; seqs 11..12 before it lost too", True)),
        Fence(13, 100.0, 110.0),
    ),
    "a replayed unusable batch one past the next: the one before it lost too": Row(
        Given(),
        12,
        0.0,
        REPLAY,
        Lose(Loss(2, "bad; seqs 11..11 before it lost too", True)),
        Fence(12, 100.0, 110.0),
    ),
    "the first batch unusable: the fence starts on it, with no time": Row(
        Given(fence=None), 0, 0.0, LIVE, Lose(Loss(1, "bad", True)), Fence(0, 0.0, 0.0)
    ),
    "after the repair, what is still missing before it is lost": Row(
        Given(fence=None),
        2,
        0.0,
        REPAIRED,
        Lose(Loss(3, "bad; seqs 0..1 before it lost too", True)),
        Fence(2, 0.0, 0.0),
    ),
}


@pytest.mark.parametrize("row", UNUSABLE.values(), ids=UNUSABLE.keys())
def test_unusable(row: Row) -> None:
    order = row.given.order()
    before = order.fence

    decision = order.unusable(row.seq, "bad", row.mode)
    assert decision == row.decision
    assert order.fence == (row.fence or before)
    consumed = row.seq if type(decision) is Lose else None if before is None else before.seq
    assert order.applied == consumed


def test_follows_only_the_next_seq_of_the_same_engine() -> None:
    order = Given().order()
    assert not order.follows(12, 120.0) and order.fence == AT_10, "a gap"
    assert not order.follows(11, 99.0) and order.fence == AT_10, "a previous engine's"
    assert not order.follows(10, 120.0) and order.fence == AT_10, "a restart"
    assert order.follows(11, 120.0) and order.fence == Fence(11, 100.0, 120.0)
    empty = Given(fence=None).order()
    assert not empty.follows(1, 5.0) and empty.fence is None
    assert empty.follows(0, 5.0) and empty.fence == Fence(0, 5.0, 5.0)


STORED = {
    "no bound yet: read the store's fence": (None, ApplyOutcome.APPLIED, True, None),
    "applied: the bound moves": (AT_10, ApplyOutcome.APPLIED, False, Fence(11, 100.0, 120.0)),
    "restarted: the bound starts over": (
        AT_10,
        ApplyOutcome.RESTARTED,
        False,
        Fence(11, 120.0, 120.0),
    ),
    "duplicate: the store is ahead, the bound stays": (
        AT_10,
        ApplyOutcome.DUPLICATE,
        False,
        AT_10,
    ),
    "previous engine: the bound stays": (AT_10, ApplyOutcome.PREVIOUS_ENGINE, False, AT_10),
}


@pytest.mark.parametrize(("stored", "outcome", "read", "after"), STORED.values(), ids=STORED.keys())
def test_stored_outcome_moves_the_lower_bound_of_the_stores_fence(
    stored: Fence | None, outcome: ApplyOutcome, read: bool, after: Fence | None
) -> None:
    order = StreamOrder()
    order.stored = stored
    assert order.stored_outcome(outcome, 11, 120.0) is read
    assert order.stored == after
    assert order.applied == 11


def test_a_batch_the_store_cannot_take_is_consumed_and_lost_leaving_the_stores_fence() -> None:
    order = StreamOrder()
    order.load(AT_10)
    assert order.place(11, 120.0, LIVE) == APPLY
    assert order.not_stored(11, "TypeError: bad") == Loss(
        1, "batch seq 11 could not be applied (TypeError: bad)", True
    )
    assert order.applied == 11 and order.fence == Fence(11, 100.0, 120.0)
    assert order.stored == AT_10, "the store's fence did not move"
    assert order.place(12, 121.0, LIVE) == APPLY, "the next batch follows: no gap, no replay"


AUDIT = {
    "nothing seen stored: nothing to lose": (None, None, False),
    "the store holds no fence any more": (AT_10, None, True),
    "the store's fence is behind": (AT_10, Fence(4, 100.0, 104.0), True),
    "an older epoch is behind": (AT_10, Fence(50, 90.0, 104.0), True),
    "the same fence": (AT_10, AT_10, False),
    "the store is ahead (another replica)": (AT_10, Fence(12, 100.0, 130.0), False),
}


@pytest.mark.parametrize(("seen", "read", "lost"), AUDIT.values(), ids=AUDIT.keys())
def test_audit_finds_a_lost_index(seen: Fence | None, read: Fence | None, lost: bool) -> None:
    order = StreamOrder()
    order.load(seen)
    assert order.audit(read) is lost


INDEX_LOST = {
    "with a fence: rebuild what it held": (AT_10, None, 10, 10),
    "without one: nothing held": (None, None, -1, -1),
    "again while rebuilding: the most the lost index held is kept": (None, 20, -1, 20),
}


@pytest.mark.parametrize(
    ("fence", "rebuilding", "held", "rebuild_from"), INDEX_LOST.values(), ids=INDEX_LOST.keys()
)
def test_a_lost_index_forgets_the_fence_and_asks_a_rebuild_from_seq_0(
    fence: Fence | None, rebuilding: int | None, held: int, rebuild_from: int
) -> None:
    order = Given(fence=fence, rebuild_from=rebuilding).order()
    assert order.may_group == (rebuilding is None)

    assert order.index_lost() == held
    assert (order.fence, order.stored, order.applied) == (None, None, None)
    assert order.rebuild_from == rebuild_from
    assert order.resync and not order.may_group and order.losses == 1
    assert order.catch_up() == 0
    assert not order.resync


@dataclass
class Replay:
    """One catch-up: its replay from `start` ends with `batches` (None: failed)."""

    given: Given
    batches: int | None
    after: AfterReplay
    stop: bool = False
    """A restart was seen in it (the replay stopped)."""
    lose_index: bool = False
    """The store lost the index while it ran."""
    rebuild_from: int | None = None


NOT_REBUILT = f"{LOST_INDEX}; seqs 0..10 not rebuilt: every attempt timed out"

REPLAYED = {
    "the same engine replayed what it buffers: done": Replay(Given(), 4, AfterReplay()),
    "a failed replay from seq > 0: nothing more (the gap shows the loss)": Replay(
        Given(), None, AfterReplay()
    ),
    "nothing at the last applied seq: the engine was replaced, replay from 0": Replay(
        Given(), 0, AfterReplay(from_zero=True)
    ),
    "a restart stopped the replay: replay from 0": Replay(
        Given(), 1, AfterReplay(from_zero=True), stop=True
    ),
    "the store lost the index meanwhile: stop, the next catch-up rebuilds": Replay(
        Given(), 4, AfterReplay(stale=True), lose_index=True, rebuild_from=10
    ),
    "a rebuild from seq 0 replayed: exact again": Replay(
        Given(fence=None, rebuild_from=10), 11, AfterReplay()
    ),
    "a rebuild from seq 0 that failed: what the lost index held is lost": Replay(
        Given(fence=None, rebuild_from=10),
        None,
        AfterReplay(loss=Loss(11, NOT_REBUILT, False)),
    ),
    "a rebuild of an index that held nothing: nothing lost": Replay(
        Given(fence=None, rebuild_from=-1), None, AfterReplay()
    ),
    "a replay from seq 0 without a rebuild: nothing lost": Replay(
        Given(fence=None), None, AfterReplay()
    ),
}


@pytest.mark.parametrize("row", REPLAYED.values(), ids=REPLAYED.keys())
def test_replayed(row: Replay) -> None:
    order = row.given.order()
    start = order.catch_up()
    order.replay_begins(start)
    if row.stop:
        assert order.place(5, 200.0, REPLAY) is STOP
    if row.lose_index:
        order.index_lost()
    if row.batches is None:
        order.replay_failed("every attempt timed out")

    assert order.replayed(start, row.batches) == row.after
    assert order.rebuild_from == row.rebuild_from


def test_without_a_replay_endpoint_a_rebuild_loses_what_the_index_held() -> None:
    order = Given(fence=None, rebuild_from=3).order()
    order.catch_up()
    why = "no replay endpoint is configured"
    assert order.without_replay() == Loss(4, f"{LOST_INDEX}; seqs 0..3 not rebuilt: {why}", False)
    assert order.rebuild_from is None and order.repair_failure == why
    assert order.without_replay() is None, "shown once"


def test_a_restart_seen_late_stops_the_replay_then_is_replayed_from_seq_0() -> None:
    """The "False stops the replay" case end to end: live restart -> catch-up from the last
    applied seq -> the replay meets the new engine's batch -> stop -> replay from 0."""
    order = Given().order()
    assert order.place(3, 193.0, LIVE) == Repair("engine restart seen at seq 3", None)

    start = order.catch_up()
    order.replay_begins(start)
    assert start == 10
    assert order.place(10, 200.0, REPLAY) is STOP, "a newer batch under the last applied seq"
    assert order.replayed(start, 1) == AfterReplay(from_zero=True)

    order.replay_begins(0)
    assert order.place(0, 190.0, REPLAY) == Apply(ApplyOutcome.RESTARTED)
    for seq in range(1, 11):
        assert order.place(seq, 190.0 + seq, REPLAY) is APPLY
    assert order.place(3, 193.0, REPAIRED) == Skip(ApplyOutcome.DUPLICATE), "the held one"
    assert order.fence == Fence(10, 190.0, 200.0)


def test_a_new_catch_up_forgets_the_last_ones_restart_and_failure() -> None:
    order = Given(replay_start=10).order()
    assert order.place(5, 200.0, REPLAY) is STOP
    order.replay_failed("timeout")
    start = order.catch_up()
    assert order.repair_failure is None
    assert order.replayed(start, 3) == AfterReplay()
