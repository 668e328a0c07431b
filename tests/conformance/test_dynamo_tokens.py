"""Dynamo's edges (store/tokens.py) on every backend: a prompt's tokens hashes walk a
worker's stores from the first block, through any medium, as long as it holds them."""

from __future__ import annotations

from kvsi.store.base import IndexStore
from kvsi.store.model import Batch, EntriesRemoved, EntriesStored, Hash, WorkerCleared, WorkerKey
from tests.conformance.checks import apply_twice

W = WorkerKey("vllm-0", 0)
OTHER = WorkerKey("vllm-1", 1)
BIG = 2**64 - 5
"""A block hash above 2^63: Redis keeps it as a negative member."""
BLOCKS = [BIG, 11, 12, 13]
TOKENS = [2**64 - 1, 101, 102, 103]
"""Dynamo's hashes of the blocks' tokens (u64, one above 2^63)."""


def stored(
    blocks: list[Hash], tokens: list[int] | None, parent: int | None, medium: str = "GPU"
) -> EntriesStored:
    return EntriesStored(blocks, medium, parent_block_hash=parent, tokens_hashes=tokens)


async def test_a_walk_follows_the_stores_chain_through_every_medium(store: IndexStore) -> None:
    batch = Batch(
        1,
        1.0,
        [
            stored(BLOCKS[:2], TOKENS[:2], None),
            stored(BLOCKS[2:], TOKENS[2:], BLOCKS[1], "CPU"),
        ],
    )
    await apply_twice(store, W, batch)
    await store.apply(OTHER, Batch(1, 1.0, [stored(BLOCKS[1:2], TOKENS[1:2], BLOCKS[0])]))

    held = await store.match_tokens(TOKENS, [W, OTHER])

    assert held == {W: [("GPU",), ("GPU",), ("CPU",), ("CPU",)]}  # OTHER lacks the first
    assert await store.match_tokens([TOKENS[0], 999, TOKENS[2]], [W]) == {W: [("GPU",)]}
    assert await store.match_tokens(TOKENS[1:], [W]) == {}  # not a prompt's start
    assert await store.match_tokens(TOKENS, [OTHER]) == {}
    assert await store.match_tokens(tuple(TOKENS), (W,)) == {W: held[W]}  # type: ignore[arg-type]
    edges = await store.token_edges(W)
    assert edges == {
        BIG: (None, TOKENS[0]),
        11: (BIG, TOKENS[1]),
        12: (11, TOKENS[2]),
        13: (12, TOKENS[3]),
    }


async def test_an_edge_goes_when_no_medium_holds_its_block(store: IndexStore) -> None:
    await store.apply(
        W,
        Batch(
            1,
            1.0,
            [stored(BLOCKS, TOKENS, None), stored(BLOCKS[1:2], TOKENS[1:2], BIG, "CPU")],
        ),
    )
    await apply_twice(store, W, Batch(2, 2.0, [EntriesRemoved([11], "GPU")]))
    assert await store.match_tokens(TOKENS, [W]) == {W: [("GPU",), ("CPU",), ("GPU",), ("GPU",)]}

    await apply_twice(store, W, Batch(3, 3.0, [EntriesRemoved([11], "CPU")]))

    assert await store.match_tokens(TOKENS, [W]) == {W: [("GPU",)]}
    assert 11 not in await store.token_edges(W)


async def test_a_clear_drops_every_edge_and_a_store_after_it_starts_again(
    store: IndexStore,
) -> None:
    await store.apply(W, Batch(1, 1.0, [stored(BLOCKS, TOKENS, None)]))
    await apply_twice(store, W, Batch(2, 2.0, [WorkerCleared(), stored([BIG], TOKENS[:1], None)]))

    assert await store.match_tokens(TOKENS, [W]) == {W: [("GPU",)]}
    assert await store.token_edges(W) == {BIG: (None, TOKENS[0])}


async def test_stores_without_tokens_hashes_add_no_edge(store: IndexStore) -> None:
    await store.apply(W, Batch(1, 1.0, [stored(BLOCKS, None, None)]))

    assert await store.match_tokens(TOKENS, [W]) == {}
    assert await store.token_edges(W) == {}
    assert await store.token_edges(OTHER) == {}


async def test_a_store_with_fewer_tokens_hashes_than_blocks_links_only_those(
    store: IndexStore,
) -> None:
    await store.apply(
        W, Batch(1, 1.0, [stored(BLOCKS, TOKENS[:2], None), stored([b"\x01" * 32], [5], None)])
    )

    assert await store.match_tokens(TOKENS, [W]) == {W: [("GPU",), ("GPU",)]}
    assert set(await store.token_edges(W)) == {BIG, 11}  # a digest block has no edge
