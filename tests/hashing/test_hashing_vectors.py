"""Every vector of hashes.json (vLLM 0.33's own block hasher): digests, event forms, payloads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvsi.hashing import BlockHasher, MMFeature, RequestKeys, block_hashes, get_algorithm, none_hash
from kvsi.hashing.algorithms import none_hash_seed
from kvsi.hashing.serialize import HashValue
from tests.paths import WIRE

VECTORS: dict[str, Any] = json.loads((WIRE / "hashes.json").read_text())


def _seed_label(pythonhashseed: str | None) -> str:
    return "PYTHONHASHSEED-unset" if pythonhashseed is None else f"PYTHONHASHSEED={pythonhashseed}"


CASES = [
    pytest.param(
        vector_set,
        case,
        id=f"{vector_set['algo']}-{_seed_label(vector_set['PYTHONHASHSEED'])}-{case['name']}"
        f"-bs{case['block_size']}",
    )
    for vector_set in VECTORS["vector_sets"]
    for case in vector_set["cases"]
]

NONE_HASHES = [
    pytest.param(entry, id=f"{entry['algo']}-{_seed_label(entry['PYTHONHASHSEED'])}")
    for entry in VECTORS["none_hashes"]
]


def _needs_algorithm(algo: str) -> None:
    if algo.startswith("xxhash"):
        pytest.importorskip("xxhash", reason="the xxhash extra is not installed")


def as_json(value: HashValue) -> Any:
    """hashes.json's spelling of a hashed value: tuples as lists, bytes as {"bytes_hex"}."""
    if isinstance(value, tuple):
        return [as_json(item) for item in value]
    if isinstance(value, bytes):
        return {"bytes_hex": value.hex()}
    return value


def test_vectors_cover_every_algorithm_seed_and_case() -> None:
    sets = {(v["algo"], v["PYTHONHASHSEED"]) for v in VECTORS["vector_sets"]}
    assert len(sets) == 6
    assert {algo for algo, _ in sets} == {"sha256", "sha256_cbor", "xxhash", "xxhash_cbor"}
    assert len(CASES) == 6 * 18
    assert len(NONE_HASHES) == 8


@pytest.mark.parametrize("entry", NONE_HASHES)
def test_none_hash_payload_and_digest_equal_vllm(entry: dict[str, Any]) -> None:
    _needs_algorithm(entry["algo"])
    algorithm = get_algorithm(entry["algo"])
    assert none_hash_seed(algorithm, entry["PYTHONHASHSEED"]) == entry["seed"]
    assert algorithm.serialize(entry["seed"]).hex() == entry["payload_hex"]
    assert none_hash(algorithm, entry["PYTHONHASHSEED"]).hex() == entry["none_hash_hex"]


@pytest.mark.parametrize(("vector_set", "case"), CASES)
def test_block_hashes_equal_vllm(vector_set: dict[str, Any], case: dict[str, Any]) -> None:
    _needs_algorithm(vector_set["algo"])
    hasher = BlockHasher(
        block_size=case["block_size"],
        algorithm=vector_set["algo"],
        hash_seed=vector_set["PYTHONHASHSEED"],
        lookahead=case["num_hash_lookahead_tokens"],
    )
    assert hasher.none_hash.hex() == vector_set["none_hash_hex"]
    lora = case["lora"] or {}
    keys = RequestKeys(
        lora_name=lora.get("lora_name"),
        lora_path=lora.get("lora_path"),
        cache_salt=case["cache_salt"],
        mm_features=[
            MMFeature(f["identifier"], f["offset"], f["length"]) for f in case["mm_features"] or ()
        ],
    )
    token_ids = VECTORS["token_sets"][case["tokens"]]
    blocks = hasher.blocks(token_ids, keys)

    assert len(blocks) == len(case["blocks"])
    for block, expected in zip(blocks, case["blocks"], strict=True):
        where = f"block {expected['index']}"
        assert block.index == expected["index"], where
        assert [block.start, block.end] == expected["token_range"], where
        assert as_json(block.extra_keys) == expected["extra_keys"], where
        assert len(block.digest) == vector_set["digest_bytes"], where
        assert block.digest.hex() == expected["block_hash_hex"], where
        assert block.event_hash == int(expected["event_hash_int"]), where
        assert block.digest.hex() == expected["event_hash_bytes_hex"], where
        if "payload_hex" in expected:
            assert block.payload.hex() == expected["payload_hex"], where
    assert hasher.digests(token_ids, keys) == [block.digest for block in blocks]


@pytest.mark.parametrize(("vector_set", "case"), CASES)
def test_one_shot_block_hashes_give_both_event_forms(
    vector_set: dict[str, Any], case: dict[str, Any]
) -> None:
    _needs_algorithm(vector_set["algo"])
    lora = case["lora"] or {}
    options: dict[str, Any] = {
        "block_size": case["block_size"],
        "algorithm": vector_set["algo"],
        "hash_seed": vector_set["PYTHONHASHSEED"],
        "lora_name": lora.get("lora_name"),
        "lora_path": lora.get("lora_path"),
        "cache_salt": case["cache_salt"],
        "mm_features": [
            MMFeature(f["identifier"], f["offset"], f["length"]) for f in case["mm_features"] or ()
        ],
        "lookahead": case["num_hash_lookahead_tokens"],
    }
    token_ids = VECTORS["token_sets"][case["tokens"]]
    ints = block_hashes(token_ids, **options)
    digests = block_hashes(token_ids, **options, external="bytes")
    assert ints == [int(b["event_hash_int"]) for b in case["blocks"]]
    assert [d.hex() for d in digests] == [b["event_hash_bytes_hex"] for b in case["blocks"]]


def test_payload_vectors_exist_for_blocks_0_and_1_of_every_multiblock_case() -> None:
    for vector_set in VECTORS["vector_sets"]:
        for case in vector_set["cases"]:
            with_payload = [b["index"] for b in case["blocks"] if "payload_hex" in b]
            assert with_payload == [0, 1][: len(case["blocks"])], case["name"]
