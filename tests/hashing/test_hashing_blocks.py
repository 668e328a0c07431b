"""Block chaining beyond the vectors: which blocks get hashes, extra-key rules, input errors."""

from __future__ import annotations

import hashlib
import pickle
import sys
from typing import Any

import pytest

from kvsi.hashing import (
    ALGORITHMS,
    BlockHasher,
    MMFeature,
    RequestKeys,
    block_hashes,
    event_hash_int,
    get_algorithm,
)

TOKENS = list(range(1000, 1100))


@pytest.mark.parametrize(
    ("num_tokens", "expected_blocks"), [(0, 0), (1, 0), (15, 0), (16, 1), (31, 1), (40, 2)]
)
def test_only_full_blocks_get_a_hash(num_tokens: int, expected_blocks: int) -> None:
    assert len(block_hashes(TOKENS[:num_tokens])) == expected_blocks


def test_a_block_hash_depends_only_on_its_prefix() -> None:
    full = block_hashes(TOKENS, block_size=8)
    assert len(full) == 12
    for blocks in range(13):
        assert block_hashes(TOKENS[: blocks * 8 + 3], block_size=8) == full[:blocks]


@pytest.mark.parametrize(
    ("num_tokens", "lookahead", "expected_blocks"),
    [(16, 1, 0), (17, 1, 1), (32, 1, 1), (33, 1, 2), (18, 3, 0), (19, 3, 1), (35, 3, 2)],
)
def test_lookahead_blocks_wait_for_their_next_tokens(
    num_tokens: int, lookahead: int, expected_blocks: int
) -> None:
    hashes = block_hashes(TOKENS[:num_tokens], lookahead=lookahead)
    assert len(hashes) == expected_blocks


def test_lookahead_tokens_follow_the_keys_in_the_third_element() -> None:
    blocks = BlockHasher(block_size=4, lookahead=2).blocks(TOKENS[:10])
    assert [b.extra_keys for b in blocks] == [(None, 1004, 1005), (None, 1008, 1009)]
    assert block_hashes(TOKENS[:10], block_size=4, lookahead=2) != block_hashes(
        TOKENS[:8], block_size=4
    )


def test_event_int_is_the_digest_last_8_bytes_unsigned() -> None:
    blocks = BlockHasher(block_size=1).blocks(TOKENS)
    assert all(b.event_hash == int.from_bytes(b.digest[24:], "big") for b in blocks)
    assert any(b.event_hash >= 2**63 for b in blocks)
    assert event_hash_int(bytes(range(16))) == 0x08090A0B0C0D0E0F


def test_hasher_reused_across_requests_equals_one_shot_calls() -> None:
    hasher = BlockHasher(block_size=16, algorithm="sha256_cbor", hash_seed="7")
    keys = RequestKeys(cache_salt="tenant")
    for tokens in (TOKENS, TOKENS[:50], list(range(64))):
        expected = block_hashes(
            tokens, algorithm="sha256_cbor", hash_seed="7", cache_salt="tenant", external="bytes"
        )
        assert hasher.digests(tokens, keys) == expected


def test_token_sequences_of_any_kind_hash_alike() -> None:
    expected = block_hashes(list(range(48)))
    assert block_hashes(tuple(range(48))) == expected
    assert block_hashes(range(48)) == expected


def test_pythonhashseed_changes_sha256_hashes_and_empty_counts_as_set() -> None:
    unset = block_hashes(TOKENS)
    assert block_hashes(TOKENS, hash_seed="0") != unset
    assert block_hashes(TOKENS, hash_seed="") != unset
    assert block_hashes(TOKENS, hash_seed="vllm-none-hash") == unset


def test_empty_cache_salt_adds_nothing_and_salt_marks_only_block_0() -> None:
    assert block_hashes(TOKENS, cache_salt="") == block_hashes(TOKENS)
    salted = BlockHasher().blocks(TOKENS, RequestKeys(cache_salt="tenant-1"))
    assert salted[0].extra_keys == (("cache_salt", "tenant-1"),)
    assert all(b.extra_keys is None for b in salted[1:])
    assert all(
        a.digest != b.digest for a, b in zip(salted, BlockHasher().blocks(TOKENS), strict=True)
    )


def test_lora_path_is_hashed_on_every_block() -> None:
    keys = RequestKeys(lora_name="a", lora_path="/adapters/a")
    blocks = BlockHasher().blocks(TOKENS, keys)
    assert all(b.extra_keys == (("lora", "a", "/adapters/a"),) for b in blocks)
    assert block_hashes(TOKENS, lora_name="a", lora_path="/adapters/a") != block_hashes(
        TOKENS, lora_name="a", lora_path="/other/a"
    )


def test_multimodal_items_in_a_window_get_offsets_relative_to_its_start() -> None:
    features = [MMFeature("late", 9, 2), MMFeature("early", 2, 5)]  # out of prompt order
    blocks = BlockHasher(block_size=4, lookahead=1).blocks(
        TOKENS[:13], RequestKeys(mm_features=features)
    )
    keys = [b.extra_keys[0] if isinstance(b.extra_keys, tuple) else None for b in blocks]
    assert keys == [
        (("mm", "early", 2),),
        # Window [4, 9): "early" began 2 tokens before it.
        (("mm", "early", -2),),
        # Window [8, 13): "late" starts in the block itself.
        (("mm", "late", 1),),
    ]
    lookahead_only = BlockHasher(block_size=4, lookahead=1).blocks(
        TOKENS[:5], RequestKeys(mm_features=[MMFeature("next", 4, 3)])
    )
    assert lookahead_only[0].extra_keys == ((("mm", "next", 4),), 1004)


def test_equal_identifiers_are_written_in_full_and_the_mm_tag_is_shared() -> None:
    identifier = "same-image"
    keys = RequestKeys(mm_features=[MMFeature(identifier, 0, 2), MMFeature(identifier, 2, 2)])
    block = BlockHasher(block_size=4).blocks(TOKENS[:4], keys)[0]
    tag = "mm"
    vllm_object = (
        BlockHasher().none_hash,
        tuple(TOKENS[:4]),
        ((tag, b"same-image".decode(), 0), (tag, b"same-image".decode(), 2)),
    )
    assert block.payload == pickle.dumps(vllm_object, protocol=5)
    assert block.payload.count(b"same-image") == 2
    assert block.payload.count(b"\x8c\x02mm") == 1


def test_one_character_values_share_one_object_as_in_cpython() -> None:
    block = BlockHasher(block_size=4).blocks(TOKENS[:4], RequestKeys(lora_name="x", lora_path="x"))[
        0
    ]
    assert block.payload == pickle.dumps(
        (BlockHasher().none_hash, tuple(TOKENS[:4]), (("lora", "x", "x"),)), protocol=5
    )


def test_prompt_embeddings_digest_their_rows_per_block() -> None:
    rows, width = 10, 3
    raw = bytes(range(rows * width * 2))
    embeds = memoryview(raw).cast("h", (rows, width))
    tokens = [0] * rows + [7, 8]
    blocks = BlockHasher(block_size=4).blocks(tokens, RequestKeys(prompt_embeds=embeds))
    row_bytes = width * 2
    assert [b.extra_keys for b in blocks] == [
        (("prompt_embeds", hashlib.sha256(raw[: 4 * row_bytes]).digest()),),
        # Rows [8, 12) of a 10-row tensor: the two that exist.
        (("prompt_embeds", hashlib.sha256(raw[4 * row_bytes : 8 * row_bytes]).digest()),),
        (("prompt_embeds", hashlib.sha256(raw[8 * row_bytes :]).digest()),),
    ]


def test_prompt_embedding_positions_must_hold_token_0() -> None:
    embeds = memoryview(bytes(32)).cast("B", (4, 8))
    with pytest.raises(ValueError, match="prompt-embedding positions must be 0"):
        block_hashes([0, 0, 5, 0, 9], block_size=2, prompt_embeds=embeds)


def test_unknown_algorithm_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="sha256, sha256_cbor, xxhash, xxhash_cbor") as error:
        block_hashes(TOKENS, algorithm="md5")
    assert "'md5'" in str(error.value)
    assert ALGORITHMS == ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


@pytest.mark.parametrize("algorithm", ["xxhash", "xxhash_cbor"])
def test_xxhash_without_pythonhashseed_is_refused_as_unreproducible(algorithm: str) -> None:
    pytest.importorskip("xxhash")
    with pytest.raises(ValueError, match="not reproducible without the engine's PYTHONHASHSEED"):
        BlockHasher(algorithm=algorithm)
    assert len(BlockHasher(algorithm=algorithm, hash_seed="0").none_hash) == 16


def test_xxhash_without_the_package_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xxhash", None)
    with pytest.raises(
        ModuleNotFoundError, match=r"pip install xxhash .*kv-session-index\[xxhash\]"
    ):
        get_algorithm("xxhash")
    assert get_algorithm("sha256").digest_size == 32


class _IntLike:
    """Stands in for NumPy integers: int-valued, but not Python ints."""

    def __index__(self) -> int:
        return 5


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"block_size": 0}, "block_size must be an int >= 1"),
        ({"block_size": -16}, "block_size must be an int >= 1"),
        ({"block_size": 16.0}, "block_size must be an int >= 1"),
        ({"block_size": True}, "block_size must be an int >= 1"),
        ({"lookahead": -1}, "lookahead must be an int >= 0"),
        ({"hash_seed": 0}, "hash_seed must be the engine's PYTHONHASHSEED as a str"),
        ({"lora_name": "a"}, "lora_name and lora_path go together"),
        ({"lora_path": "/a"}, "lora_name and lora_path go together"),
        ({"lora_name": 1, "lora_path": "/a"}, "lora_name must be a str"),
        ({"cache_salt": b"salt"}, "cache_salt must be a str"),
        ({"mm_features": [("id", 0, 4)]}, "mm_features must hold MMFeature values"),
        ({"prompt_embeds": b"\x00" * 8}, "prompt_embeds must be a memoryview"),
        ({"prompt_embeds": memoryview(bytes(8))[::2]}, "prompt_embeds must be C-contiguous"),
        ({"external": "hex"}, "external must be 'int' or 'bytes'"),
    ],
)
def test_invalid_options_raise_value_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        block_hashes(TOKENS, **options)


@pytest.mark.parametrize("bad", [-1, True, 1.0, "7", _IntLike(), None])
def test_token_ids_must_be_non_negative_python_ints(bad: object) -> None:
    tokens: list[Any] = [*TOKENS[:20], bad, *TOKENS[20:]]
    with pytest.raises(ValueError, match=r"token_ids\[20\] is .*non-negative Python ints"):
        block_hashes(tokens)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ((1, 0, 4), "MMFeature.identifier must be a str"),
        (("id", -1, 4), "MMFeature.offset must be an int >= 0"),
        (("id", 0, 0), "MMFeature.length must be an int >= 1"),
        (("id", 0, 2.5), "MMFeature.length must be an int >= 1"),
    ],
)
def test_invalid_multimodal_features_raise_value_errors(
    fields: tuple[Any, Any, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        MMFeature(*fields)
