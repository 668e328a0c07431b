"""vLLM 0.33's prefix-cache block hashes from token ids, as the engine publishes them in events.

Imports the standard library only (xxhash when an xxhash algorithm is chosen); no zmq, fastapi,
redis or store: the subscriber, the API and the simulator can all use it.
"""

from kvsi.hashing.algorithms import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    DEFAULT_NONE_HASH_SEED,
    HashAlgorithm,
    get_algorithm,
    none_hash,
)
from kvsi.hashing.blocks import BlockHasher, HashedBlock, block_hashes, event_hash_int
from kvsi.hashing.extra_keys import MMFeature, RequestKeys
from kvsi.hashing.serialize import HashValue, cbor_dumps, pickle_dumps

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "DEFAULT_NONE_HASH_SEED",
    "BlockHasher",
    "HashAlgorithm",
    "HashValue",
    "HashedBlock",
    "MMFeature",
    "RequestKeys",
    "block_hashes",
    "cbor_dumps",
    "event_hash_int",
    "get_algorithm",
    "none_hash",
    "pickle_dumps",
]
