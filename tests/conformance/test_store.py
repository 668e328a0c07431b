"""Behaviour every IndexStore backend must share (run once per backend)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsi.store.base import IndexStore
from kvsi.store.hashtext import format_hash
from kvsi.store.model import (
    ApplyOutcome,
    Batch,
    EntriesRemoved,
    EntriesStored,
    Fence,
    Hash,
    IndexLostError,
    StoreEvent,
    WorkerCleared,
    WorkerKey,
    WorkerState,
    WorkerStatus,
)
from tests.conformance.checks import all_pages, apply_twice, dump, events
from tests.conformance.conftest import StoreFactory
from tests.conformance.reference import Reference

A = WorkerKey("pod-a", 0)
B = WorkerKey("pod-b", 1)
BIG = 2**64 - 59
DIGEST = bytes(range(32))


async def test_stored_blocks_form_the_session_residency(store: IndexStore) -> None:
    batch = Batch(0, 10.0, [EntriesStored([1, BIG, DIGEST], "GPU", 0, "s1")])
    assert await apply_twice(store, A, batch) is ApplyOutcome.APPLIED
    view = await store.get_session("s1")
    assert view is not None
    assert view.total_blocks == 3
    assert [(w.pod, w.dp_rank, w.blocks, w.by_medium) for w in view.workers] == [
        ("pod-a", 0, 3, {"GPU": 3})
    ]
    assert view.workers[0].last_seen == 10.0
    assert await store.get_session("never") is None


async def test_removed_block_leaves_every_session_that_held_it(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s1")]))
    await apply_twice(store, A, Batch(1, 2.0, [EntriesStored([2, 3], "GPU", 0, "s2")]))
    await apply_twice(store, A, Batch(2, 3.0, [EntriesRemoved([2], "GPU", 0)]))
    s1 = await store.get_session("s1")
    s2 = await store.get_session("s2")
    assert s1 is not None and s2 is not None
    assert (s1.total_blocks, s2.total_blocks) == (1, 1)
    pages = await all_pages(
        lambda limit, cursor: store.worker_blocks(
            "pod-a", dp_rank=None, medium=None, limit=limit, cursor=cursor
        )
    )
    assert pages == ["1", "3"]


async def test_removal_is_per_medium_and_group(store: IndexStore) -> None:
    events: list[StoreEvent] = [
        EntriesStored([5], "GPU", 0, "s"),
        EntriesStored([5], "CPU", 0, "s"),
        EntriesStored([5], "GPU", 1, "s"),
    ]
    await apply_twice(store, A, Batch(0, 1.0, events))
    await apply_twice(store, A, Batch(1, 2.0, [EntriesRemoved([5], "GPU", 0)]))
    view = await store.get_session("s")
    assert view is not None
    assert view.workers[0].by_medium == {"CPU": 1, "GPU": 1}
    cpu = await store.session_blocks("s", pod=None, medium="CPU", limit=10, cursor=None)
    assert cpu is not None and cpu.items == [5]


async def test_none_medium_and_group_mean_gpu_and_zero(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 1.0, [EntriesStored([9], None, None, "s")]))
    await apply_twice(store, A, Batch(1, 2.0, [EntriesRemoved([9], "GPU", 0)]))
    view = await store.get_session("s")
    assert view is not None and view.total_blocks == 0


async def test_storing_again_is_set_semantics(store: IndexStore) -> None:
    """A reuse report re-announces resident blocks: one removal still removes them."""
    await apply_twice(store, A, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s1")]))
    await apply_twice(store, A, Batch(1, 2.0, [EntriesStored([1, 2], "GPU", 0, "s2")]))
    await apply_twice(store, A, Batch(2, 3.0, [EntriesRemoved([1], "GPU", 0)]))
    workers = await store.list_workers()
    assert workers[0].blocks == 1
    for sid in ("s1", "s2"):
        view = await store.get_session(sid)
        assert view is not None and view.total_blocks == 1


async def test_all_blocks_cleared_empties_only_that_worker(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))
    await apply_twice(store, B, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))
    await apply_twice(store, A, Batch(1, 2.0, [WorkerCleared()]))
    view = await store.get_session("s")
    assert view is not None
    # pod-a still listed: it holds nothing, and the clear took the block it held.
    assert [(w.pod, w.blocks, w.lost_blocks) for w in view.workers] == [
        ("pod-b", 1, 0),
        ("pod-a", 0, 1),
    ]


async def test_blocks_without_session_count_for_the_worker_only(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, None)]))
    (worker,) = await store.list_workers()
    assert (worker.blocks, worker.sessions) == (2, 0)
    page = await store.list_sessions(pod=None, limit=10, cursor=None)
    assert page.items == []


async def test_old_seq_changes_nothing_and_restart_empties_worker(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(5, 100.0, [EntriesStored([1], "GPU", 0, "s")]))
    await apply_twice(store, A, Batch(6, 101.0, [EntriesStored([2], "GPU", 0, "s")]))
    assert await store.apply(A, Batch(5, 100.0, [EntriesRemoved([1])])) is ApplyOutcome.DUPLICATE
    restarted = Batch(0, 200.0, [EntriesStored([7], "GPU", 0, "t")])
    assert await store.apply(A, restarted) is ApplyOutcome.RESTARTED
    stale = Batch(7, 102.0, [EntriesStored([3], "GPU", 0, "s")])
    assert await store.apply(A, stale) is ApplyOutcome.PREVIOUS_ENGINE
    s = await store.get_session("s")
    assert s is not None and s.total_blocks == 0
    fence = await store.fence(A)
    assert fence is not None and (fence.seq, fence.epoch_ts) == (0, 200.0)


async def test_a_fence_behind_the_expected_one_is_a_lost_index(store: IndexStore) -> None:
    first = Batch(4, 100.0, [EntriesStored([1], "GPU", 0, "s")])
    assert await store.apply(A, first) is ApplyOutcome.APPLIED
    seen = await store.fence(A)
    assert seen is not None
    assert await store.apply(A, Batch(5, 101.0, [EntriesStored([2], "GPU", 0, "s")]), seen) is (
        ApplyOutcome.APPLIED
    )
    # A duplicate or a newer engine behind the expected fence is fine: the store is ahead.
    assert await store.apply(A, first, seen) is ApplyOutcome.DUPLICATE
    restarted = Batch(0, 200.0, [EntriesStored([9], "GPU", 0, "t")])
    assert await store.apply(A, restarted, seen) is ApplyOutcome.RESTARTED
    newer = await store.fence(A)
    assert newer is not None
    # Behind: same engine, older seq; or an older engine; or no fence at all.
    for expected in (Fence(1, 200.0, 200.0), Fence(0, 300.0, 300.0)):
        with pytest.raises(IndexLostError, match="pod-a/0"):
            await store.apply(A, Batch(1, 200.5, [EntriesRemoved([9])]), expected)
    await store.remove_worker(A)
    with pytest.raises(IndexLostError, match="no fence"):
        await store.apply(A, Batch(1, 200.5, [EntriesRemoved([9])]), newer)
    assert await store.list_workers() == []  # nothing was written by the refused batches
    assert await store.apply(A, Batch(1, 200.5, [EntriesStored([3], "GPU", 0, "t")])) is (
        ApplyOutcome.APPLIED
    )
    view = await store.get_session("t")
    assert view is not None and view.total_blocks == 1


async def test_sessions_listed_most_recent_first_with_cursor(store: IndexStore) -> None:
    for i in range(7):
        await store.apply(A, Batch(i, float(i), [EntriesStored([i], "GPU", 0, f"s{i}")]))
    await store.apply(B, Batch(0, 3.5, [EntriesStored([99], "GPU", 0, "s0")]))
    seen: list[str] = []
    cursor = None
    while True:
        page = await store.list_sessions(pod=None, limit=2, cursor=cursor)
        seen.extend(s.session_id for s in page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ["s6", "s5", "s4", "s0", "s3", "s2", "s1"]
    only_b = await store.list_sessions(pod="pod-b", limit=10, cursor=None)
    assert [s.session_id for s in only_b.items] == ["s0"]


async def test_status_is_recorded_and_registers_the_worker(store: IndexStore) -> None:
    await store.set_status(B, WorkerStatus(WorkerState.DEGRADED, 5.0, "gap", 3))
    (worker,) = await store.list_workers()
    assert (worker.pod, worker.dp_rank, worker.status.state) == ("pod-b", 1, "degraded")
    assert worker.status.batches_lost == 3 and worker.last_seq is None


async def test_the_status_carries_the_streams_counters(store: IndexStore) -> None:
    counted = WorkerStatus(
        WorkerState.LIVE, 5.0, gaps=2, replays=3, restarts=1, lag_batches=40, lag_seconds=1.5
    )
    await store.set_status(B, counted)
    (worker,) = await store.list_workers()
    assert worker.status == counted
    await store.set_status(B, WorkerStatus(WorkerState.LIVE, 5.0))  # a new stream: from 0
    (worker,) = await store.list_workers()
    assert (worker.status.gaps, worker.status.lag_seconds) == (0, 0.0)


async def test_a_status_of_an_older_roster_epoch_is_refused(store: IndexStore) -> None:
    """Central replicas handing a pod over: the one about to release it (its view of the
    roster older) cannot write its status over the new owner's; an unfenced write (a
    process that does not split the pods) always lands and keeps the fence."""
    assert await store.set_status(B, WorkerStatus(WorkerState.LIVE, 5.0), epoch=20)
    stale = WorkerStatus(WorkerState.CONNECTING, 6.0, "connecting")
    assert not await store.set_status(B, stale, epoch=19)
    (worker,) = await store.list_workers()
    assert (worker.status.state, worker.status.since) == ("live", 5.0)
    assert await store.set_status(B, WorkerStatus(WorkerState.DEGRADED, 7.0, "gap"), epoch=20)
    assert await store.set_status(B, WorkerStatus(WorkerState.LIVE, 8.0))
    assert not await store.set_status(B, stale, epoch=19)
    assert await store.set_status(B, stale, epoch=21)
    (worker,) = await store.list_workers()
    assert (worker.status.state, worker.status.since) == ("connecting", 6.0)


async def test_remove_worker_forgets_it(store: IndexStore) -> None:
    await store.apply(A, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))
    await store.remove_worker(A)
    assert await store.list_workers() == []
    view = await store.get_session("s")
    assert view is None or view.total_blocks == 0
    assert (
        await store.worker_blocks("pod-a", dp_rank=None, medium=None, limit=5, cursor=None) is None
    )


async def test_idle_sessions_without_blocks_expire(store: IndexStore) -> None:
    await store.apply(A, Batch(0, 10.0, [EntriesStored([1], "GPU", 0, "gone")]))
    await store.apply(A, Batch(1, 11.0, [EntriesStored([2], "GPU", 0, "kept")]))
    await store.apply(A, Batch(2, 12.0, [EntriesRemoved([1])]))
    assert await store.expire_sessions(older_than=10.5, limit=1000) == (1, 1, False)
    assert await store.get_session("gone") is None
    assert await store.get_session("kept") is not None


# -- property: random event sequences against the reference model -------------------------

steps = st.lists(
    st.tuples(
        st.sampled_from([A, B]),
        st.integers(min_value=0, max_value=6),
        st.integers(min_value=0, max_value=6).map(float),
        st.lists(events, max_size=4),
    ),
    max_size=25,
)


def _hash_set(items: set[tuple[str, int, Hash]]) -> list[str]:
    return sorted({format_hash(h) for _, _, h in items})


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=steps)
async def test_random_sequences_match_the_reference_model(
    make_store: StoreFactory, plan: list[tuple[WorkerKey, int, float, list[StoreEvent]]]
) -> None:
    store = await make_store()
    ref = Reference()
    for worker, seq, ts, evs in plan:
        batch = Batch(seq, ts, evs)
        assert (await store.apply(worker, batch)).value == ref.apply(worker, batch)
    for worker in (A, B):
        page = await store.worker_blocks(
            worker.pod, dp_rank=worker.dp_rank, medium=None, limit=1000, cursor=None
        )
        expected = _hash_set(ref.entries.get(worker, set()))
        got = sorted(format_hash(h) for h in page.items) if page else []
        assert got == expected
    views = {WorkerKey(w.pod, w.dp_rank): w for w in await store.list_workers()}
    losses = await store.worker_losses()
    assert set(losses) == set(views)
    for worker, view in views.items():
        holding = {s for (s, w), held in ref.residency.items() if w == worker and held}
        assert view.sessions == len(holding)
        assert view.blocks == len(ref.entries.get(worker, set()))
        assert losses[worker] == ref.worker_losses(worker)
    for sid in ("s1", "s2", "s3"):
        view = await store.get_session(sid)
        want = ref.session_blocks(sid)
        if sid not in ref.seen_sessions:
            assert view is None
            continue
        assert view is not None
        got_workers = {WorkerKey(w.pod, w.dp_rank): w for w in view.workers}
        listed = ref.session_workers(sid)
        assert set(got_workers) == set(listed)
        for worker, progress in listed.items():
            got = got_workers[worker]
            assert got.lost_blocks == progress.lost
            size = progress.block_size
            assert got.reprefill_tokens == (None if size is None else progress.lost * size)
            frontier = (
                None if got.frontier is None else tuple(msgspec.structs.astuple(got.frontier))
            )
            assert frontier == progress.frontier
        for worker, held in want.items():
            by_medium: dict[str, int] = {}
            for medium, _, _ in held:
                by_medium[medium] = by_medium.get(medium, 0) + 1
            assert got_workers[worker].blocks == len(held)
            assert got_workers[worker].by_medium == by_medium
            page = await store.session_blocks(
                sid, pod=worker.pod, medium=None, limit=1000, cursor=None
            )
            assert page is not None
            assert sorted(format_hash(h) for h in page.items) == _hash_set(held)
        assert view.total_blocks == sum(len(h) for h in want.values())
    await _prefix_matches_are_bounded_by_the_reference(store, ref, plan)


async def _prefix_matches_are_bounded_by_the_reference(
    store: IndexStore, ref: Reference, plan: list[tuple[WorkerKey, int, float, list[StoreEvent]]]
) -> None:
    """A prefix match names every worker holding the prompt's first block as the start of a
    prompt (never fewer), only workers holding it (never more), each with its exact run."""
    stored = [
        h for *_, evs in plan for e in evs if isinstance(e, EntriesStored) for h in e.block_hashes
    ]
    tail = list(dict.fromkeys(stored))[:4]
    for first in dict.fromkeys(stored):
        prompt = [first, *tail]
        got = await store.match_prefix(prompt, None)
        must = {w for w in (A, B) if first in ref.firsts.get(w, set())}
        may = {w for w in (A, B) if ref.holds(w, first)}
        assert must <= set(got) <= may, (first, got)
        for worker, run in got.items():
            assert run == ref.held_run(worker, prompt)


async def test_unconfirmed_entries_are_dropped_unless_stored_again(store: IndexStore) -> None:
    await store.apply(A, Batch(0, 1.0, [EntriesStored([1, 2, 3], "GPU", 0, "s")]))
    await store.apply(A, Batch(1, 2.0, [EntriesStored([4], "CPU", 0, "t")]))
    assert await store.mark_unconfirmed(A) == 4
    (worker,) = await store.list_workers()
    assert (worker.blocks, worker.unconfirmed) == (4, 4)
    await store.apply(A, Batch(5, 3.0, [EntriesStored([2], "GPU", 0, "u"), EntriesRemoved([3])]))
    (worker,) = await store.list_workers()
    assert (worker.blocks, worker.unconfirmed) == (3, 2)
    assert await store.drop_unconfirmed(A) == 2
    view = await store.get_session("s")
    assert view is not None and view.total_blocks == 1
    page = await store.worker_blocks("pod-a", dp_rank=0, medium=None, limit=10, cursor=None)
    assert page is not None and page.items == [2]
    (worker,) = await store.list_workers()
    assert worker.unconfirmed == 0
    assert await store.drop_unconfirmed(A) == 0


async def test_prefix_match_is_the_held_run_from_the_first_block(store: IndexStore) -> None:
    await store.apply(A, Batch(0, 1.0, [EntriesStored([1, 2, 3], "GPU", 0, "s")]))
    await store.apply(A, Batch(1, 2.0, [EntriesStored([2, 5], "CPU", 0, None)]))
    await store.apply(B, Batch(0, 1.0, [EntriesStored([2, 3], "GPU", 1, "s")]))
    got = await store.match_prefix([1, 2, 3, 4, 5], None)
    assert got == {A: [("GPU",), ("CPU", "GPU"), ("GPU",)]}, "B lacks the first block"
    only_b = await store.match_prefix([2, 3, 9], [B, WorkerKey("nobody", 0)])
    assert only_b == {B: [("GPU",), ("GPU",)]}
    assert await store.match_prefix([2, 3, 9], [A]) == {A: [("CPU", "GPU"), ("GPU",)]}
    assert await store.match_prefix([DIGEST], [A]) == {}
    # Any sequence of hashes, any collection of workers: the compiled memory store too.
    assert await store.match_prefix((2, 3, 9), {B}) == only_b  # type: ignore[arg-type]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=steps, chunk=st.integers(min_value=2, max_value=6), runs=st.booleans())
async def test_apply_many_equals_applying_one_by_one(
    make_store: StoreFactory,
    plan: list[tuple[WorkerKey, int, float, list[StoreEvent]]],
    chunk: int,
    runs: bool,
) -> None:
    """Chunks of one worker's batches through apply_many: the same outcomes and index as
    apply of each. With `runs`, seqs follow each other (the backlog case a backend may land
    in one step); without, duplicates, restarts and older engines come mixed in."""
    one, many = await make_store(), await make_store()
    if runs:
        seqs = {A: 0, B: 0}
        ordered = []
        for worker, _, ts, evs in plan:
            ordered.append((worker, seqs[worker], ts + seqs[worker], evs))
            seqs[worker] += 1
        plan = ordered
    expected = [(await one.apply(worker, Batch(seq, ts, evs))) for worker, seq, ts, evs in plan]
    got = []
    for worker in (A, B):
        mine = [Batch(seq, ts, evs) for w, seq, ts, evs in plan if w == worker]
        for start in range(0, len(mine), chunk):
            got += [(worker, o) for o in await many.apply_many(worker, mine[start : start + chunk])]
    by_worker = [
        (w, o) for w in (A, B) for (w2, *_), o in zip(plan, expected, strict=True) if w2 == w
    ]
    assert got == by_worker
    assert await dump(many) == await dump(one)


async def test_apply_many_checks_the_expected_fence(store: IndexStore) -> None:
    first = Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")])
    assert await store.apply(A, first) is ApplyOutcome.APPLIED
    seen = await store.fence(A)
    assert seen is not None
    await store.remove_worker(A)
    more = [
        Batch(1, 2.0, [EntriesStored([2], "GPU", 0, "s")]),
        Batch(2, 3.0, [EntriesRemoved([1])]),
    ]
    with pytest.raises(IndexLostError):
        await store.apply_many(A, more, seen)
    assert await store.list_workers() == []
    assert await store.apply_many(A, more) == [ApplyOutcome.APPLIED, ApplyOutcome.APPLIED]
