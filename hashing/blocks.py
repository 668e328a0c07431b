"""The block-hash chain of vLLM 0.33 over a request's full blocks, and the forms events carry.

Imports the standard library and the hashing package only (no zmq, fastapi, redis or store).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, overload

from kvsi.hashing.algorithms import DEFAULT_ALGORITHM, get_algorithm, none_hash
from kvsi.hashing.extra_keys import MMFeature, RequestKeys
from kvsi.hashing.serialize import HashValue

_NO_KEYS = RequestKeys()


def event_hash_int(digest: bytes) -> int:
    """The u64 a KV event carries for `digest` by default (HASHING.md §7).

    The last 8 bytes, big-endian and unsigned: half of all values exceed a signed 64-bit int.
    Only events are truncated; the chain itself always continues from the full digest.
    """
    return int.from_bytes(digest[-8:], "big")


@dataclass(frozen=True, slots=True)
class HashedBlock:
    """One hashed block with everything that went into its digest, for tracing mismatches."""

    index: int
    start: int
    """First token of the block; the block is tokens `[start, end)`."""
    end: int
    extra_keys: HashValue
    """The hashed tuple's third element: §5's keys, or with lookahead (keys, *next tokens)."""
    payload: bytes
    """The serialized `(parent, tokens, extra_keys)` that was digested."""
    digest: bytes
    """vLLM's internal BlockHash, and the event value with USE_INT_BLOCK_HASHES=0."""

    @property
    def event_hash(self) -> int:
        """The event value with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 (the default)."""
        return event_hash_int(self.digest)


def _token_tuple(token_ids: Sequence[int]) -> tuple[int, ...]:
    """The token ids as the engine hashes them; rejects what would pickle differently."""
    tokens = tuple(token_ids)
    if not all(type(token) is int for token in tokens) or (tokens and min(tokens) < 0):
        index, token = next(
            (index, token)
            for index, token in enumerate(tokens)
            if type(token) is not int or token < 0
        )
        raise ValueError(
            f"token_ids[{index}] is {token!r}: token ids must be non-negative Python ints "
            "(NumPy integers or bools would serialize to other bytes)"
        )
    return tokens


class BlockHasher:
    """One engine configuration's block hasher: algorithm, NONE_HASH, block size, lookahead.

    Build it once per deployment (NONE_HASH is computed here) and hash any number of
    requests with it. Every argument must match the engine's, see HASHING.md §2.
    """

    __slots__ = ("_algorithm", "block_size", "lookahead", "none_hash")

    def __init__(
        self,
        *,
        block_size: int = 16,
        algorithm: str = DEFAULT_ALGORITHM,
        hash_seed: str | None = None,
        lookahead: int = 0,
    ) -> None:
        """`block_size` is the hash block size (§2.1: not a hybrid group's block size).

        `hash_seed` is the engine's PYTHONHASHSEED, None if unset (§4). `lookahead` is the
        number of EAGLE/MTP lookahead tokens each hash covers, 0 unless §6 applies.
        Raises ValueError for any invalid value (and for xxhash without a seed).
        """
        if type(block_size) is not int or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {block_size!r}")
        if type(lookahead) is not int or lookahead < 0:
            raise ValueError(f"lookahead must be an int >= 0, got {lookahead!r}")
        self._algorithm = get_algorithm(algorithm)
        self.block_size = block_size
        self.lookahead = lookahead
        self.none_hash = none_hash(self._algorithm, hash_seed)
        """The parent digest of every request's first block."""

    @property
    def algorithm(self) -> str:
        """The `--prefix-caching-hash-algo` value this hasher reproduces."""
        return self._algorithm.name

    def blocks(self, token_ids: Sequence[int], keys: RequestKeys = _NO_KEYS) -> list[HashedBlock]:
        """Every full block of the request with its extra keys, payload and digest.

        A trailing partial block gets no hash; with lookahead `L`, a block also waits for its
        `L` following tokens, so `N` tokens give `(N - L) // block_size` blocks.
        """
        return [
            HashedBlock(index, start, start + self.block_size, extra_keys, payload, digest)
            for index, (start, extra_keys, payload, digest) in enumerate(
                self._chain(token_ids, keys)
            )
        ]

    def digests(self, token_ids: Sequence[int], keys: RequestKeys = _NO_KEYS) -> list[bytes]:
        """The internal BlockHash of every full block (see `blocks` for which blocks)."""
        return [digest for _, _, _, digest in self._chain(token_ids, keys)]

    def _chain(
        self, token_ids: Sequence[int], keys: RequestKeys
    ) -> Iterator[tuple[int, HashValue, bytes, bytes]]:
        """(start, extra keys, payload, digest) of each full block, each chained to the last."""
        tokens = _token_tuple(token_ids)
        if any(tokens[: keys.embedding_rows]):
            raise ValueError(
                "token ids at prompt-embedding positions must be 0, the placeholder vLLM "
                "hashes there"
            )
        size, lookahead = self.block_size, self.lookahead
        serialize, digest = self._algorithm.serialize, self._algorithm.digest
        parent = self.none_hash
        for start in range(0, len(tokens) - size - lookahead + 1, size):
            end = start + size
            extra_keys: HashValue = keys.for_window(start, end + lookahead) if keys else None
            if lookahead:
                extra_keys = (extra_keys, *tokens[end : end + lookahead])
            payload = serialize((parent, tokens[start:end], extra_keys))
            parent = digest(payload)
            yield start, extra_keys, payload, parent


@overload
def block_hashes(
    token_ids: Sequence[int],
    *,
    block_size: int = ...,
    algorithm: str = ...,
    hash_seed: str | None = ...,
    lora_name: str | None = ...,
    lora_path: str | None = ...,
    cache_salt: str | None = ...,
    mm_features: Sequence[MMFeature] = ...,
    prompt_embeds: memoryview | None = ...,
    lookahead: int = ...,
    external: Literal["int"] = ...,
) -> list[int]: ...


@overload
def block_hashes(
    token_ids: Sequence[int],
    *,
    block_size: int = ...,
    algorithm: str = ...,
    hash_seed: str | None = ...,
    lora_name: str | None = ...,
    lora_path: str | None = ...,
    cache_salt: str | None = ...,
    mm_features: Sequence[MMFeature] = ...,
    prompt_embeds: memoryview | None = ...,
    lookahead: int = ...,
    external: Literal["bytes"],
) -> list[bytes]: ...


def block_hashes(
    token_ids: Sequence[int],
    *,
    block_size: int = 16,
    algorithm: str = DEFAULT_ALGORITHM,
    hash_seed: str | None = None,
    lora_name: str | None = None,
    lora_path: str | None = None,
    cache_salt: str | None = None,
    mm_features: Sequence[MMFeature] = (),
    prompt_embeds: memoryview | None = None,
    lookahead: int = 0,
    external: Literal["int", "bytes"] = "int",
) -> list[int] | list[bytes]:
    """The hashes a vLLM 0.33 engine publishes in KV events for these tokens' full blocks.

    `external` is the event form: "int" (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default)
    or "bytes" (=0, the digests). One-shot convenience: to hash many requests, build a
    `BlockHasher` and `RequestKeys` once. Raises ValueError for any invalid argument.
    """
    if external not in ("int", "bytes"):
        raise ValueError(f"external must be 'int' or 'bytes', got {external!r}")
    hasher = BlockHasher(
        block_size=block_size, algorithm=algorithm, hash_seed=hash_seed, lookahead=lookahead
    )
    keys = RequestKeys(
        lora_name=lora_name,
        lora_path=lora_path,
        cache_salt=cache_salt,
        mm_features=mm_features,
        prompt_embeds=prompt_embeds,
    )
    digests = hasher.digests(token_ids, keys)
    if external == "bytes":
        return digests
    return [event_hash_int(digest) for digest in digests]
