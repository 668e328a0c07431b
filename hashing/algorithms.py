"""vLLM 0.33's prefix-cache hash algorithms (`--prefix-caching-hash-algo`) and their NONE_HASH.

Imports the standard library and hashing.serialize; xxhash only once an xxhash algorithm is
chosen, because it is an optional extra (`kv-session-index[xxhash]`), as it is in vLLM.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from kvsi.hashing.serialize import HashValue, cbor_dumps, pickle_dumps

DEFAULT_ALGORITHM = "sha256"
"""vLLM's default (`CacheConfig.prefix_caching_hash_algo`)."""

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
"""NONE_HASH seed of the sha256 algorithms when the engine runs without PYTHONHASHSEED."""

ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
"""Every value of `--prefix-caching-hash-algo` in vLLM 0.33 (HASHING.md §3)."""


@dataclass(frozen=True, slots=True)
class HashAlgorithm:
    """How one algorithm turns a hashed object into a block digest (HASHING.md §3)."""

    name: str
    serialize: Callable[[HashValue], bytes]
    digest: Callable[[bytes], bytes]
    digest_size: int
    default_seed: str | None
    """NONE_HASH seed without PYTHONHASHSEED; None where vLLM draws a random one per process."""


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _xxh3_128() -> Callable[[bytes], bytes]:
    """XXH3-128 with seed 0, canonical (big-endian) digest; imported on first use."""
    try:
        import xxhash
    except ImportError as exc:
        raise ModuleNotFoundError(
            "the xxhash algorithms need the xxhash package: "
            "pip install xxhash (or kv-session-index[xxhash])"
        ) from exc
    return xxhash.xxh3_128_digest


def get_algorithm(name: str) -> HashAlgorithm:
    """The algorithm vLLM runs for `--prefix-caching-hash-algo=name`.

    Raises ValueError for an unknown name (listing the valid ones) and ModuleNotFoundError
    for an xxhash algorithm when the xxhash package is not installed.
    """
    serialize = {
        "sha256": pickle_dumps,
        "sha256_cbor": cbor_dumps,
        "xxhash": pickle_dumps,
        "xxhash_cbor": cbor_dumps,
    }.get(name)
    if serialize is None:
        raise ValueError(
            f"unknown hash algorithm {name!r}; vLLM 0.33 offers {', '.join(ALGORITHMS)}"
        )
    if name.startswith("sha256"):
        return HashAlgorithm(name, serialize, _sha256, 32, DEFAULT_NONE_HASH_SEED)
    return HashAlgorithm(name, serialize, _xxh3_128(), 16, None)


def none_hash_seed(algorithm: HashAlgorithm, hash_seed: str | None) -> str:
    """The str the engine digests into NONE_HASH (HASHING.md §4).

    `hash_seed` is the engine's PYTHONHASHSEED (None: unset). Set, even to "", it is the seed
    for every algorithm; so it changes sha256 hashes too, a frequent cause of mismatches.
    Raises ValueError for an xxhash algorithm without it: vLLM then seeds NONE_HASH with
    random bytes per process, and no one outside that process can reproduce its hashes.
    """
    if hash_seed is not None:
        if not isinstance(hash_seed, str):
            raise ValueError(
                f"hash_seed must be the engine's PYTHONHASHSEED as a str, got {hash_seed!r}"
            )
        return hash_seed
    if algorithm.default_seed is None:
        raise ValueError(
            f"{algorithm.name} hashes are not reproducible without the engine's "
            "PYTHONHASHSEED: vLLM seeds NONE_HASH randomly per process when it is unset; "
            "pass hash_seed=<the engine's PYTHONHASHSEED>"
        )
    return algorithm.default_seed


def none_hash(algorithm: HashAlgorithm, hash_seed: str | None) -> bytes:
    """NONE_HASH, the parent digest of every request's first block (HASHING.md §4)."""
    return algorithm.digest(algorithm.serialize(none_hash_seed(algorithm, hash_seed)))
