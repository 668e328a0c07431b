"""Dynamo's local block hash: what its KV router and standalone indexer key a block by.

Imports the standard library and xxhash (the optional `kv-session-index[xxhash]` extra, loaded
on first use). Dynamo hashes each full block's token ids alone, not chained to the blocks
before it (its radix tree chains them by position instead): xxh3-64 of the tokens as
little-endian u32, seeded with 1337 plus the LoRA name's and the salt's own xxh3 hashes
(`compute_block_hash_for_seq` in ai-dynamo/dynamo `lib/kv-router/src/protocols.rs`,
`compute_salt_hash`). A partial last block has no hash. tests/hashing/test_dynamo_hash.py
holds this to vectors generated from the ai-dynamo-runtime wheel.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from functools import lru_cache
from importlib import import_module
from typing import Any

SEED = 1337
"""Dynamo's XXH3_SEED: the seed of a block with neither LoRA nor salt."""

_U64 = 2**64
_U32 = next(code for code in "IL" if array(code).itemsize == 4)
"""The array type code of an unsigned 32-bit int here (little-endian on every platform
Dynamo ships for; the tokens' bytes are hashed as it lays them out)."""


@lru_cache(maxsize=1)
def _xxh3() -> Any:
    try:
        return import_module("xxhash").xxh3_64_intdigest
    except ImportError as exc:  # the optional extra
        raise RuntimeError(
            "Dynamo's block hashes need the xxhash package: pip install 'kv-session-index[xxhash]'"
        ) from exc


@lru_cache(maxsize=256)
def tokens_seed(lora_name: str | None = None, salt: str | None = None) -> int:
    """The xxh3 seed of a request's blocks: empty names count as none, as in Dynamo."""
    xxh3 = _xxh3()
    seed = SEED
    if lora_name:
        seed = (seed + xxh3(lora_name.encode(), 0)) % _U64
    if salt:  # seeded 1, so a salt never collides with the same string as a LoRA name
        seed = (seed + xxh3(salt.encode(), 1)) % _U64
    return seed


def tokens_hashes(
    token_ids: Sequence[int],
    block_size: int,
    lora_name: str | None = None,
    salt: str | None = None,
) -> list[int]:
    """Dynamo's local hash of each full block of `token_ids` (u64), in order.

    Raises ValueError for a block size below 1 or a token id outside u32 (Dynamo's type).
    """
    if block_size < 1:
        raise ValueError(f"block size must be at least 1, not {block_size}")
    xxh3 = _xxh3()
    seed = tokens_seed(lora_name, salt)
    end = len(token_ids) - len(token_ids) % block_size
    try:
        packed = memoryview(array(_U32, token_ids[:end]).tobytes())
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"token ids must be u32: {exc}") from exc
    step = 4 * block_size
    return [xxh3(packed[start : start + step], seed) for start in range(0, len(packed), step)]
