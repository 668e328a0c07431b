"""WorkerHealth: how connection, losses, repairs and the stale clock fold into one status."""

from __future__ import annotations

import time

from kvsi.store.model import WorkerState
from kvsi.subscriber.health import WorkerHealth


def test_connecting_then_live_then_disconnected_with_since_and_detail() -> None:
    health = WorkerHealth("tcp://e:1")
    assert health.status().state is WorkerState.CONNECTING
    assert health.status().detail == "connecting to tcp://e:1"
    health.connect(True)
    syncing = health.status()
    assert syncing.state is WorkerState.CONNECTING
    assert syncing.detail == "connected to tcp://e:1; replaying what it still buffers"
    health.synced()
    live = health.status()
    assert (live.state, live.detail) == (WorkerState.LIVE, "")
    health.connect(False)
    down = health.status()
    assert down.state is WorkerState.DISCONNECTED and "disconnected" in down.detail
    assert down.since >= live.since


def test_degraded_wins_over_connection_changes_until_exact_again() -> None:
    health = WorkerHealth("tcp://e:1")
    health.connect(True)
    health.synced()
    health.lose(3, "seqs 4..6 lost: x", stale_deadline=time.monotonic() + 60)
    since = health.status().since
    health.connect(False)
    assert health.status().detail.endswith("publisher tcp://e:1 disconnected")
    health.connect(True)
    health.synced()
    status = health.status()
    assert (status.state, status.batches_lost, status.since) == (WorkerState.DEGRADED, 3, since)
    assert status.detail.startswith("seqs 4..6 lost")
    health.lose(2, "seqs 9..10 lost: y", stale_deadline=None)
    assert health.status().batches_lost == 5 and health.stale_deadline is not None
    health.exact_again()
    assert health.status().state is WorkerState.LIVE
    assert health.stale_deadline is None and health.status().batches_lost == 5


def test_the_stale_clock_and_its_outcome_in_the_detail() -> None:
    health = WorkerHealth("tcp://e:1")
    assert health.seconds_to_stale_drop() is None
    health.lose(1, "lost", stale_deadline=time.monotonic() - 1)
    assert health.seconds_to_stale_drop() == 0.0
    health.stale_dropped(7)
    assert health.stale_deadline is None
    assert "7 entries not reconfirmed since were dropped" in health.status().detail


def test_a_repair_in_progress_shows_degraded_until_done() -> None:
    health = WorkerHealth("tcp://e:1")
    health.connect(True)
    health.synced()
    health.changed.clear()
    health.repairing("batches dropped; repairing by replay")
    assert health.changed.is_set()
    assert health.status().state is WorkerState.DEGRADED
    assert health.repairing_detail is not None
    health.repairing(None)
    assert health.status().state is WorkerState.LIVE


def test_a_resource_limit_shows_degraded_with_why_never_connecting_or_live() -> None:
    health = WorkerHealth("tcp://e:1")
    health.blocked("cannot open a socket: Too many open files")
    status = health.status()
    assert (status.state, status.detail) == (
        WorkerState.DEGRADED,
        "cannot open a socket: Too many open files",
    )
    health.blocked(None)
    assert health.status().state is WorkerState.CONNECTING
    health.connect(True)
    health.synced()
    health.lose(2, "seqs 1..2 lost", stale_deadline=None)
    health.blocked("cannot open a replay socket")
    assert health.status().detail == "cannot open a replay socket; seqs 1..2 lost"
    health.blocked(None)
    health.exact_again()
    assert health.status().state is WorkerState.LIVE
