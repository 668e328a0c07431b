"""The change feed: per-batch residency deltas, worker states, ids, filters, bounds."""

from __future__ import annotations

import gc

import pytest

from kvsi.store.feed import (
    FeedHub,
    FeedRecord,
    HistoryGone,
    Overflow,
    ResidencyChange,
    ResidencyRow,
    WorkerChange,
)
from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    WorkerCleared,
    WorkerKey,
    WorkerState,
    WorkerStatus,
)

A = WorkerKey("pod-a", 0)


async def take(hub: FeedHub, after: str | None = None, **filters: frozenset[str]) -> list:
    sub = hub.subscribe(after=after, **filters)
    out = []
    while not sub.queue.empty():
        out.append(await sub.next())
    hub.unsubscribe(sub)
    return out


async def test_each_batch_yields_one_change_per_session_with_totals() -> None:
    store = MemoryStore()
    hub = await store.change_feed()
    watcher = hub.subscribe(after=None)
    await store.apply(A, Batch(0, 1.0, [EntriesStored([1, 2, 3], "GPU", 0, "s1")]))
    await store.apply(A, Batch(1, 2.0, [EntriesStored([3, 4], "GPU", 0, "s2")]))
    await store.apply(A, Batch(2, 3.0, [EntriesStored([1, 2], "GPU", 0, "s1")]))  # reuse only
    await store.apply(A, Batch(3, 4.0, [EntriesRemoved([3, 1])]))
    await store.apply(A, Batch(4, 5.0, [WorkerCleared()]))
    got = []
    while not watcher.queue.empty():
        entry = await watcher.next()
        assert isinstance(entry.change, ResidencyChange)
        c = entry.change
        got.append((c.session_id, c.added, c.removed, c.blocks, c.ts))
    assert got == [
        ("s1", 3, 0, 3, 1.0),
        ("s2", 2, 0, 2, 2.0),
        ("s1", 0, 2, 1, 4.0),
        ("s2", 0, 1, 1, 4.0),
        ("s1", 0, 1, 0, 5.0),
        ("s2", 0, 1, 0, 5.0),
    ]


async def test_the_rows_a_write_keeps_in_the_history_are_not_tracked_by_the_gc() -> None:
    store = MemoryStore()
    hub = await store.change_feed()
    await store.apply(A, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s1")]))
    await store.apply(A, Batch(1, 2.0, [EntriesStored([3], "GPU", 0, "s2"), WorkerCleared()]))
    await store.apply(A, Batch(2, 3.0, [EntriesRemoved([1])]))
    records = [record for _, record in hub._history]
    rows = [row for record in records for row in record.rows]
    assert rows == [
        ResidencyRow("s1", 2, 0, 2),
        ResidencyRow("s1", 0, 2, 0),
        ResidencyRow("s2", 1, 1, 0),
    ]
    assert not any(map(gc.is_tracked, rows))


async def test_worker_state_changes_are_in_the_feed_once() -> None:
    store = MemoryStore()
    hub = await store.change_feed()
    watcher = hub.subscribe(after=None)
    for state in (WorkerState.LIVE, WorkerState.LIVE, WorkerState.DEGRADED):
        await store.set_status(A, WorkerStatus(state, 7.0, "gap" if state == "degraded" else ""))
    changes = [(await watcher.next()).change for _ in range(watcher.queue.qsize())]
    assert changes == [
        WorkerChange("pod-a", 0, "live", 7.0, ""),
        WorkerChange("pod-a", 0, "degraded", 7.0, "gap"),
    ]


async def test_resume_after_an_id_filters_and_history_bounds() -> None:
    hub = FeedHub(history=3)
    for i in range(5):
        hub.publish(
            FeedRecord(
                f"pod-{i % 2}",
                0,
                float(i),
                (ResidencyRow("s", 1, 0, i + 1), ResidencyRow("t", 1, 0, 1)),
            )
        )
    everything = await take(hub, after="4.0")
    assert [e.id for e in everything] == ["4.1", "5.0", "5.1"]
    only_t = await take(hub, after="3.1", sessions=frozenset({"t"}))
    assert [e.id for e in only_t] == ["4.1", "5.1"]
    only_pod0 = await take(hub, after="3.0", pods=frozenset({"pod-0"}))
    assert [e.id for e in only_pod0] == ["3.1", "5.0", "5.1"]
    with pytest.raises(HistoryGone):
        hub.subscribe(after="1.0")
    with pytest.raises(HistoryGone):
        hub.subscribe(after="garbage")


@pytest.mark.parametrize(
    ("after", "says", "never"),
    [
        ("1.0", "is older than the last 3 records", "ahead"),
        ("9.0", "is ahead of this feed (newest record '5')", "older"),
        ("garbage", "is not one of this feed's ids", "older"),
    ],
)
def test_a_resume_point_not_in_the_history_says_whether_it_is_old_or_ahead(
    after: str, says: str, never: str
) -> None:
    hub = FeedHub(history=3)
    for i in range(5):
        hub.publish(FeedRecord("pod-a", 0, float(i), (ResidencyRow("s", 1, 0, i + 1),)))

    with pytest.raises(HistoryGone) as gone:
        hub.subscribe(after=after)

    assert says in str(gone.value) and never not in str(gone.value)


def test_a_resume_point_ahead_of_a_redis_stream_is_ahead() -> None:
    hub = FeedHub(history=3)
    for i in (5, 6):
        hub.deliver(f"pod-a/0@1700000000000-{i}", FeedRecord("pod-a", 0, 1.0))

    with pytest.raises(HistoryGone) as ahead:
        hub.subscribe(after="pod-a/0@1700000000001-0.0")
    with pytest.raises(HistoryGone) as older:
        hub.subscribe(after="pod-a/0@1700000000000-1.0")
    with pytest.raises(HistoryGone) as elsewhere:
        hub.subscribe(after="pod-b/0@1700000000000-1.0")

    assert "is ahead of this feed" in str(ahead.value)
    assert "is older than the last 2 records" in str(older.value)
    assert "is not in this feed's last 2 records" in str(elsewhere.value)


def test_a_resume_point_on_an_empty_feed_is_not_called_old() -> None:
    with pytest.raises(HistoryGone) as gone:
        FeedHub().subscribe(after="7.0")

    assert "holds no event yet" in str(gone.value) and "older" not in str(gone.value)


async def test_a_slow_subscriber_overflows_and_never_blocks_the_writer() -> None:
    hub = FeedHub(queue_size=4)
    slow = hub.subscribe(after=None)
    for i in range(100):
        hub.publish(FeedRecord("pod-a", 0, float(i), (ResidencyRow("s", 1, 0, i),)))
    received = 0
    with pytest.raises(Overflow):
        while True:
            await slow.next()
            received += 1
    assert received == 4


async def test_a_batch_that_raises_part_way_feeds_what_it_changed() -> None:
    """Ingest gives up a batch the store raises on (subscriber/gate.py): what the batch
    changed before it raised is in the feed, as in the index, and its fence did not move."""
    store = MemoryStore()
    hub = await store.change_feed()
    watcher = hub.subscribe(after=None)
    broken = EntriesStored(None, "GPU", 0, "s2")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await store.apply(A, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s1"), broken]))
    assert not watcher.queue.empty(), "what the batch changed is in the feed"
    entry = await watcher.next()
    assert isinstance(entry.change, ResidencyChange)
    assert (entry.change.session_id, entry.change.added, entry.change.blocks) == ("s1", 2, 2)
    assert watcher.queue.empty()
    assert await store.fence(A) is None
    view = await store.get_session("s1")
    assert view is not None and view.total_blocks == 2
