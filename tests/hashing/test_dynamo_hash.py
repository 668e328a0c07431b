"""hashing/dynamo.py equals Dynamo's own `compute_block_hash_for_seq` on vectors the
ai-dynamo-runtime wheel computed (tests/fixtures/dynamo/make_tokens_hashes.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvsi.hashing.dynamo import tokens_hashes

VECTORS = Path(__file__).parents[1] / "fixtures" / "dynamo" / "tokens_hashes.json"


def _cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(VECTORS.read_text())["cases"]
    return cases


def test_vectors_cover_block_sizes_lora_salt_and_partial_blocks() -> None:
    cases = _cases()
    assert {c["block_size"] for c in cases} >= {1, 16, 64}
    assert any(c["lora_name"] and c["salt"] for c in cases)
    assert any(len(c["tokens"]) % c["block_size"] for c in cases)  # a partial last block
    assert any(max(c["tokens"], default=0) >= 2**31 for c in cases)  # high u32 ids


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"B{c['block_size']}-{len(c['tokens'])}")
def test_tokens_hashes_equal_the_wheels(case: dict[str, Any]) -> None:
    got = tokens_hashes(case["tokens"], case["block_size"], case["lora_name"], case["salt"])
    assert got == case["hashes"]


def test_lora_and_salt_each_change_every_hash() -> None:
    tokens = list(range(32))
    plain = tokens_hashes(tokens, 16)
    lora = tokens_hashes(tokens, 16, lora_name="a")
    salted = tokens_hashes(tokens, 16, salt="a")
    assert len({*plain, *lora, *salted}) == 6


def test_bad_input_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="block size"):
        tokens_hashes([1], 0)
    with pytest.raises(ValueError, match="u32"):
        tokens_hashes([2**32], 1)
