"""The memory store's first-block directory: a prefix match reads the workers it names, not
the fleet; it names every holder (never fewer), and what it names beyond them is bounded."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvsi.store import memory as memory_module
from kvsi.store.first_blocks import FirstBlocks, Holds
from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    Hash,
    StoreEvent,
    WorkerCleared,
    WorkerKey,
)

A, B, C = WorkerKey("pod-a", 0), WorkerKey("pod-b", 0), WorkerKey("pod-c", 0)


def holding(held: dict[WorkerKey, set[Hash]]) -> Holds:
    return lambda worker, h: h in held.get(worker, set())


@pytest.mark.parametrize(
    ("noted", "held", "named"),
    [
        ([], {}, []),
        ([(1, A)], {A: {1}}, [A]),
        ([(1, A), (1, A)], {A: {1}}, [A]),
        ([(1, A), (1, B)], {A: {1}, B: {1}}, [A, B]),
        ([(1, A), (1, B)], {B: {1}}, [B]),
        ([(1, A), (1, B), (1, C)], {C: {1}}, [C]),
        ([(1, A), (2, B)], {A: {1}, B: {2}}, [A]),
        ([(1, A)], {}, []),
    ],
)
def test_a_block_names_the_workers_that_stored_it_and_hold_it(
    noted: list[tuple[Hash, WorkerKey]], held: dict[WorkerKey, set[Hash]], named: list[WorkerKey]
) -> None:
    firsts = FirstBlocks()
    for h, worker in noted:
        firsts.note(h, worker)
    assert sorted(firsts.holders(1, holding(held))) == named
    assert sorted(firsts.holders(1, holding(held))) == named, "the same once pruned"


def test_a_read_drops_what_is_no_longer_held() -> None:
    firsts = FirstBlocks()
    for worker in (A, B, C):
        firsts.note(1, worker)
    firsts.note(2, A)
    assert firsts.holders(1, holding({B: {1}})) == [B]
    assert firsts.holders(1, holding({A: {1}, B: {1}})) == [B], "A was dropped"
    assert firsts.holders(2, holding({})) == []
    assert len(firsts) == 1


def test_a_walk_spans_sweeps_and_drops_every_stale_block() -> None:
    firsts = FirstBlocks()
    for h in range(100):
        firsts.note(h, A)
    held = holding({A: set(range(0, 100, 10))})
    looked = [firsts.sweep(held, 30) for _ in range(4)]
    assert looked == [30, 30, 30, 10]
    assert len(firsts) == 10
    assert firsts.sweep(held, 30) == 10, "a new walk over what is left"


class _LookCounting(MemoryStore):
    """Notes each worker a prefix match looks at."""

    def __init__(self) -> None:
        super().__init__()
        self.looked: list[WorkerKey] = []

    def _held_prefix(
        self, w: memory_module._Worker, hashes: Sequence[Hash]
    ) -> list[tuple[str, ...]]:
        self.looked.append(w.key)
        return super()._held_prefix(w, hashes)


async def test_a_prefix_match_looks_only_at_the_workers_holding_the_first_block() -> None:
    store = _LookCounting()
    workers = [WorkerKey(f"pod-{i}", 0) for i in range(1000)]
    for i, worker in enumerate(workers):
        await store.apply(worker, Batch(0, 1.0, [EntriesStored([i + 10_000, 7], "GPU", 0, "s")]))
    for worker in workers[3:5]:
        await store.apply(worker, Batch(1, 2.0, [EntriesStored([1, 2], "GPU", 0, "t")]))
    got = await store.match_prefix([1, 2, 3], None)
    assert got == {workers[3]: [("GPU",)] * 2, workers[4]: [("GPU",)] * 2}
    assert sorted(store.looked) == workers[3:5]
    assert await store.match_prefix([7], None) == {}, "7 was stored after a parent, not first"
    assert await store.match_prefix([1, 2], [workers[4], workers[9]]) == {
        workers[4]: [("GPU",)] * 2
    }


async def test_a_store_with_a_parent_does_not_name_its_worker() -> None:
    store = MemoryStore()
    await store.apply(A, Batch(0, 1.0, [EntriesStored([5, 6], "GPU", 0, "s", parent_block_hash=4)]))
    assert len(store._firsts) == 0
    await store.apply(A, Batch(1, 2.0, [EntriesStored([4], "GPU", 0, "s")]))
    assert await store.match_prefix([4, 5, 6], None) == {A: [("GPU",)] * 3}


@pytest.mark.parametrize(
    "gone",
    [
        EntriesRemoved([1]),
        WorkerCleared(),
    ],
)
async def test_evicted_first_blocks_leave_the_directory_by_the_janitors_passes(
    gone: EntriesRemoved | WorkerCleared,
) -> None:
    store = MemoryStore()
    store.first_blocks_per_pass = store.expire_chunk = 2
    await store.apply(A, Batch(0, 1.0, [EntriesStored([h], "GPU", 0, f"s{h}") for h in (1, 2)]))
    await store.apply(B, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s1")]))
    await store.apply(A, Batch(1, 2.0, [gone]))
    assert await store.match_prefix([1], None) == {B: [("GPU",)]}
    for _ in range(2):
        await store.expire_sessions(0.0, 10)
    left = {h: store._firsts.holders(h, store._holds) for h in (1, 2)}
    want_2 = [] if isinstance(gone, WorkerCleared) else [A]
    assert left == {1: [B], 2: want_2}
    assert len(store._firsts) == 1 + len(want_2)


async def test_endless_sessions_keep_the_directory_bounded_by_what_is_held() -> None:
    store = MemoryStore()
    for turn in range(200):
        first = 1_000_000 + turn
        events: list[StoreEvent] = [EntriesStored([first, first + 500_000], "GPU", 0, f"s{turn}")]
        if turn >= 10:  # the pool holds 10 prompts: the oldest is evicted
            old = first - 10
            events.append(EntriesRemoved([old, old + 500_000]))
        await store.apply(A, Batch(turn, float(turn), events))
        if turn % 50 == 49:
            await store.expire_sessions(0.0, 1)
    assert len(store._firsts) <= 10 + 50
