"""What eviction took from a session, and its frontier, on every backend (issue #9, item 4).

Per (session, worker): `lost_blocks` counts the session's entries removed by eviction or by
the worker's cache emptying since the session last stored there; `reprefill_tokens` is that
times the block size; `frontier` is the block it stored last, with its place in the prompt
where the parent hashes tell. Every apply is replayed (`apply_twice`): nothing may count twice.
"""

from __future__ import annotations

from kvsi.store.base import IndexStore
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    Frontier,
    Hash,
    SessionOnWorker,
    WorkerCleared,
    WorkerKey,
    WorkerLosses,
)
from tests.conformance.checks import apply_twice

A = WorkerKey("pod-a", 0)
B = WorkerKey("pod-b", 1)
DIGEST = bytes(range(32))


def stored(
    hashes: list[Hash], session: str | None, parent: Hash | None = None, medium: str = "GPU"
) -> EntriesStored:
    """A store of block size 16 in group 0, as vLLM publishes them."""
    return EntriesStored(hashes, medium, 0, session, parent_block_hash=parent, block_size=16)


async def on(store: IndexStore, session: str, worker: WorkerKey) -> SessionOnWorker | None:
    view = await store.get_session(session)
    assert view is not None
    found = [w for w in view.workers if (w.pod, w.dp_rank) == worker]
    return found[0] if found else None


async def lost(store: IndexStore, session: str, worker: WorkerKey) -> tuple[int, int, int | None]:
    """(blocks, lost blocks, re-prefill tokens) of the session on the worker; the worker
    must be listed."""
    w = await on(store, session, worker)
    assert w is not None, f"{session} not listed on {worker}"
    return w.blocks, w.lost_blocks, w.reprefill_tokens


async def test_eviction_counts_until_the_session_stores_there_again(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 1.0, [stored([1, 2, 3], "s"), stored([3, 4], "t")]))
    assert await lost(store, "s", A) == (3, 0, 0)
    # 3 is shared: its eviction is a loss for both; 9 is nobody's.
    await apply_twice(store, A, Batch(1, 2.0, [EntriesRemoved([1, 3, 9], "GPU", 0)]))
    assert await lost(store, "s", A) == (1, 2, 32)
    assert await lost(store, "t", A) == (1, 1, 16)
    # Another session's store does not reset s; a removal in another medium takes nothing.
    await apply_twice(store, A, Batch(2, 3.0, [stored([5], "t"), EntriesRemoved([2], "CPU", 0)]))
    assert await lost(store, "s", A) == (1, 2, 32)
    assert await lost(store, "t", A) == (2, 0, 0)
    # Evicted to the last block: still listed, with what a next turn prefills again.
    await apply_twice(store, A, Batch(3, 4.0, [EntriesRemoved([2], "GPU", 0)]))
    assert await lost(store, "s", A) == (0, 3, 48)
    view = await store.get_session("s")
    assert view is not None and view.total_blocks == 0
    # Stored again (even blocks it had): the count starts over, then counts again.
    await apply_twice(store, A, Batch(4, 5.0, [stored([1], "s"), EntriesRemoved([1], "GPU", 0)]))
    assert await lost(store, "s", A) == (0, 1, 16)
    await apply_twice(store, A, Batch(5, 6.0, [stored([1, 2], "s")]))
    assert await lost(store, "s", A) == (2, 0, 0)


async def test_a_worker_that_never_lost_blocks_is_not_listed_once_empty(
    store: IndexStore,
) -> None:
    await apply_twice(store, A, Batch(0, 1.0, [stored([1], "s")]))
    await store.mark_unconfirmed(A)
    assert await store.drop_unconfirmed(A) == 1  # the stale policy's drop: no loss
    view = await store.get_session("s")
    assert view is not None and view.workers == []


async def test_a_cleared_cache_loses_every_block_the_session_held(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 1.0, [stored([1, 2], "s"), stored([2, 3], "t")]))
    await apply_twice(store, A, Batch(1, 2.0, [EntriesRemoved([1], "GPU", 0)]))
    await apply_twice(store, A, Batch(2, 3.0, [WorkerCleared(), stored([7], "t")]))
    assert await lost(store, "s", A) == (0, 2, 32)  # one evicted, one cleared
    assert await lost(store, "t", A) == (1, 0, 0)  # stored after the clear
    # A restart (seq back, newer engine) empties the worker the same way.
    await apply_twice(store, A, Batch(0, 10.0, [stored([8], "u")]))
    assert await lost(store, "s", A) == (0, 2, 32)  # held nothing more to lose
    assert await lost(store, "t", A) == (0, 1, 16)
    # clear_worker (a restarted engine that published nothing yet) too.
    await store.clear_worker(A)
    assert await lost(store, "u", A) == (0, 1, 16)


async def test_stale_policy_drops_are_not_losses(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 1.0, [stored([1, 2, 3], "s")]))
    await apply_twice(store, A, Batch(1, 2.0, [EntriesRemoved([1], "GPU", 0)]))
    await store.mark_unconfirmed(A)
    await apply_twice(store, A, Batch(5, 3.0, [EntriesStored([2], "GPU", 0)]))  # reconfirmed
    assert await store.drop_unconfirmed(A) == 1
    assert await lost(store, "s", A) == (1, 1, 16)


async def test_removing_the_worker_forgets_what_it_lost(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 1.0, [stored([1], "s")]))
    await apply_twice(store, B, Batch(0, 1.0, [stored([1], "s")]))
    await apply_twice(store, A, Batch(1, 2.0, [EntriesRemoved([1], "GPU", 0)]))
    await store.remove_worker(A)
    assert await on(store, "s", A) is None
    assert await lost(store, "s", B) == (1, 0, 0)


async def test_block_size_is_the_sessions_last_store_and_may_be_unknown(
    store: IndexStore,
) -> None:
    await apply_twice(store, A, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s")]))
    await apply_twice(store, A, Batch(1, 2.0, [EntriesRemoved([1], "GPU", 0)]))
    assert await lost(store, "s", A) == (1, 1, None)
    sized = EntriesStored([3], "GPU", 0, "s", block_size=32)
    await apply_twice(store, A, Batch(2, 3.0, [sized, EntriesRemoved([2, 3], "GPU", 0)]))
    assert await lost(store, "s", A) == (0, 2, 64)
    # A later store without a size keeps the one known.
    unsized = EntriesStored([4], "GPU", 0, "s")
    await apply_twice(store, A, Batch(3, 4.0, [unsized, EntriesRemoved([4], "GPU", 0)]))
    assert await lost(store, "s", A) == (0, 1, 32)


async def frontier(store: IndexStore, session: str, worker: WorkerKey) -> Frontier | None:
    w = await on(store, session, worker)
    assert w is not None
    return w.frontier


async def test_frontier_follows_the_sessions_chain(store: IndexStore) -> None:
    # Turn 1: a prompt from its start (no parent): blocks 0..2.
    await apply_twice(store, A, Batch(0, 1.0, [stored([10, 11, 12], "s")]))
    assert await frontier(store, "s", A) == Frontier(12, 2)
    # Turn 2: the reuse report of the prefix, then the new blocks after it.
    turn2 = [stored([10, 11, 12], "s"), stored([13, 14], "s", parent=12)]
    await apply_twice(store, A, Batch(1, 2.0, turn2))
    assert await frontier(store, "s", A) == Frontier(14, 4)
    # The same blocks in another medium: the frontier stays where it is.
    await apply_twice(store, A, Batch(2, 3.0, [stored([13, 14], "s", parent=12, medium="CPU")]))
    assert await frontier(store, "s", A) == Frontier(14, 4)
    # Evicting the frontier block does not move it: it is the last stored, not the last held.
    await apply_twice(store, A, Batch(3, 4.0, [EntriesRemoved([14], "GPU", 0)]))
    assert await frontier(store, "s", A) == Frontier(14, 4)
    # Other sessions, and stores without a session, leave it alone.
    await apply_twice(store, A, Batch(4, 5.0, [stored([15], "t", parent=14), stored([16], None)]))
    assert await frontier(store, "s", A) == Frontier(14, 4)
    assert await frontier(store, "t", A) == Frontier(15, None)  # t's parent is not its own
    # A continuation of a block that is not the frontier: the position is unknown, and stays
    # so along that chain until a store from the prompt's start.
    await apply_twice(store, A, Batch(5, 6.0, [stored([20], "s", parent=11)]))
    assert await frontier(store, "s", A) == Frontier(20, None)
    await apply_twice(store, A, Batch(6, 7.0, [stored([21], "s", parent=20)]))
    assert await frontier(store, "s", A) == Frontier(21, None)
    await apply_twice(store, A, Batch(7, 8.0, [stored([DIGEST], "s")]))
    assert await frontier(store, "s", A) == Frontier(DIGEST, 0)


async def test_frontier_is_per_worker_and_survives_a_clear(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 1.0, [stored([1, 2], "s")]))
    await apply_twice(store, B, Batch(0, 1.0, [stored([1], "s"), stored([5], "s", parent=1)]))
    await apply_twice(store, A, Batch(1, 2.0, [WorkerCleared()]))
    assert await frontier(store, "s", A) == Frontier(2, 1)
    assert await frontier(store, "s", B) == Frontier(5, 1)


async def test_worker_losses_sum_the_residencies(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 1.0, [stored([1, 2, 3], "s"), stored([3, 4], "t")]))
    await apply_twice(store, B, Batch(0, 1.0, [stored([1], "s")]))
    unsized = EntriesStored([8, 9], "GPU", 0, "u")
    await apply_twice(store, A, Batch(1, 2.0, [unsized, EntriesRemoved([1, 3, 8], "GPU", 0)]))
    assert await store.worker_losses() == {
        # s lost 2, t 1 (16 tokens each), u 1 of unknown size (no tokens)
        A: WorkerLosses(sessions_hurt=3, lost_blocks=4, reprefill_tokens=48),
        B: WorkerLosses(),
    }
    await apply_twice(store, A, Batch(2, 3.0, [stored([1], "s")]))
    losses = await store.worker_losses()
    assert losses[A] == WorkerLosses(sessions_hurt=2, lost_blocks=2, reprefill_tokens=16)
    await store.remove_worker(B)
    assert set(await store.worker_losses()) == {A}


async def test_an_empty_hurt_session_expires_like_any_other(store: IndexStore) -> None:
    await apply_twice(store, A, Batch(0, 1.0, [stored([1], "s")]))
    await apply_twice(store, A, Batch(1, 2.0, [EntriesRemoved([1], "GPU", 0)]))
    assert (await store.expire_sessions(older_than=100.0, limit=1000)).sessions == 1
    assert await store.get_session("s") is None
    assert (await store.worker_losses())[A] == WorkerLosses()
