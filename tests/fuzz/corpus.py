"""What the fuzzers start from: real payloads of every vLLM release, and ways to break them.

Imports msgspec, hypothesis and the wire fixtures; no sockets. `Mutator` is a seeded,
fast generator for the bulk run; the hypothesis strategies explore (and shrink) shapes.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec
from hypothesis import strategies as st

from kvsi.subscriber import wire
from tests.paths import WIRE

CORPUS: list[bytes] = sorted(p.read_bytes() for p in WIRE.glob("*/*.msgpack"))
"""Every fixture payload of every release (0.9.0 .. 0.33.0)."""

TOPIC = b"kv@pod-a@model"

HUGE_HEADERS = [
    b"\xdd\xff\xff\xff\xff",  # array32 of 2**32-1 items
    b"\xdf\xff\xff\xff\xff",  # map32
    b"\xc6\xff\xff\xff\xff",  # bin32 of 4 GiB
    b"\xdb\xff\xff\xff\xff",  # str32
    b"\xc9\xff\xff\xff\xff\x01",  # ext32
    b"\xdc\xff\xff",  # array16
]
"""msgpack headers declaring far more data than follows."""

GOOD_TS = b"\xcb" + msgspec.msgpack.encode(1.0)[1:]


def seq_frame(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def huge_declared(rng: random.Random) -> bytes:
    """A huge length where a batch, its events, or a hash list is declared."""
    header = rng.choice(HUGE_HEADERS)
    tail = rng.randbytes(rng.randrange(0, 16))
    where = rng.randrange(3)
    if where == 0:
        return header + tail
    if where == 1:
        return b"\x93" + msgspec.msgpack.encode(1.5) + header + tail
    event = b"\x82\xa4type\xabBlockStored\xacblock_hashes"
    return b"\x93" + msgspec.msgpack.encode(1.5) + b"\x91" + event + header + tail


ENCODER = msgspec.msgpack.Encoder()


class Mutator:
    """Seeded messages, about a third valid, the rest broken; `next()` gives one's frames.

    Valid batches carry a clock that moves forward and rank 0, so the stream applies them
    and the broken ones land between real applies, gaps and restarts.
    """

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seq = 0
        self.clock = 2.0e9  # after every fixture's ts, so fixtures read as older engines

    def valid(self) -> bytes:
        """A well-formed batch of a few stores, removals and rarely a clear."""
        rng = self.rng
        self.clock += rng.random()
        events: list[wire.KVCacheEvent] = []
        for _ in range(rng.randrange(1, 4)):
            hashes: list[int | bytes] = [rng.randrange(64) for _ in range(rng.randrange(1, 4))]
            kind = rng.randrange(20)
            if kind < 12:
                events.append(
                    wire.BlockStored(
                        block_hashes=hashes,
                        parent_block_hash=None,
                        token_ids=[],
                        block_size=16,
                        lora_id=None,
                        medium="GPU",
                        lora_name=None,
                        session_id=f"s{rng.randrange(4)}",
                    )
                )
            elif kind < 19:
                events.append(wire.BlockRemoved(block_hashes=hashes, medium="GPU"))
            else:
                events.append(wire.AllBlocksCleared())
        return ENCODER.encode(wire.KVEventBatch(ts=self.clock, events=events, data_parallel_rank=0))

    def _payload(self) -> bytes:
        rng = self.rng
        base = self.valid() if rng.random() < 0.5 else rng.choice(CORPUS)
        kind = rng.randrange(12)
        if kind < 4:
            return self.valid()
        if kind == 1:
            return base[: rng.randrange(len(base) + 1)]
        if kind == 2:
            data = bytearray(base)
            for _ in range(rng.randrange(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            return bytes(data)
        if kind == 3:
            return rng.randbytes(rng.randrange(0, 512))
        if kind == 4:
            return huge_declared(rng)
        if kind == 5:
            other = rng.choice(CORPUS)
            return base[: rng.randrange(len(base))] + other[rng.randrange(len(other)) :]
        if kind == 6:
            return msgspec.msgpack.encode(
                [self._value(2), [self._value(3) for _ in range(rng.randrange(4))], self._value(1)]
            )
        return base + rng.randbytes(rng.randrange(1, 8))

    def _value(self, depth: int) -> Any:
        rng = self.rng
        choices: list[Any] = [
            None,
            rng.random() > 0.5,
            rng.randrange(-(2**63), 2**64),
            rng.random() * 1e9,
            "BlockStored",
            "x" * rng.randrange(4),
            rng.randbytes(rng.randrange(33)),
        ]
        if depth > 0:
            choices.append([self._value(depth - 1) for _ in range(rng.randrange(4))])
            choices.append(
                {"type": rng.choice(["BlockStored", "BlockRemoved", "Nope"])}
                | {
                    rng.choice(["block_hashes", "medium", "group_idx", "session_id"]): (
                        self._value(depth - 1)
                    )
                    for _ in range(rng.randrange(4))
                }
            )
        return rng.choice(choices)

    def next(self) -> list[bytes]:
        rng = self.rng
        shape = rng.randrange(10)
        if shape == 0:
            return [rng.randbytes(rng.randrange(12)) for _ in range(rng.choice([0, 1, 2, 4, 5]))]
        if shape == 1:
            return [TOPIC, rng.randbytes(rng.choice([0, 1, 7, 9, 16])), self._payload()]
        self.seq += rng.choice([1, 1, 1, 1, 0, 2, -3, 1000])
        self.seq = max(self.seq, 0)
        return [TOPIC, seq_frame(self.seq), self._payload()]


def _msgpack_values() -> st.SearchStrategy[Any]:
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats()
        | st.text(max_size=8)
        | st.binary(max_size=40)
    )
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
        ),
        max_leaves=12,
    )


MSGPACK_VALUES = _msgpack_values()

KNOWN_TAGS = frozenset({"BlockStored", "BlockRemoved", "AllBlocksCleared"})

BAD_EVENTS: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**64 - 1),
    st.binary(max_size=16),
    st.fixed_dictionaries({"type": st.text(max_size=12).filter(lambda t: t not in KNOWN_TAGS)}),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["BlockStored", "BlockRemoved"]),
            "block_hashes": st.one_of(
                st.text(max_size=4),
                st.floats(),
                st.lists(st.floats() | st.text(max_size=3), min_size=1, max_size=3),
            ),
            "medium": st.none(),
        }
    ),
    st.lists(st.text(max_size=12).filter(lambda t: t not in KNOWN_TAGS), min_size=1, max_size=3),
)
"""Events the decoder must skip one by one: unknown tags, known tags with wrong types."""


def payloads() -> st.SearchStrategy[bytes]:
    """Broken and valid payloads, each kind the issue names."""
    corpus = st.sampled_from(CORPUS)
    truncated = st.tuples(corpus, st.floats(0, 1)).map(lambda t: t[0][: int(len(t[0]) * t[1])])
    flipped = st.tuples(
        corpus, st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=6)
    ).map(_flip)
    wrong_types = st.tuples(
        MSGPACK_VALUES, st.lists(MSGPACK_VALUES, max_size=3), MSGPACK_VALUES
    ).map(lambda t: msgspec.msgpack.encode(list(t)))
    huge = st.randoms(use_true_random=False).map(huge_declared)
    return st.one_of(
        corpus,
        truncated,
        flipped,
        wrong_types,
        huge,
        st.binary(max_size=200),
        MSGPACK_VALUES.map(msgspec.msgpack.encode),
    )


def _flip(args: tuple[bytes, list[tuple[float, int]]]) -> bytes:
    base, flips = args
    data = bytearray(base)
    for where, value in flips:
        data[min(int(where * len(data)), len(data) - 1)] = value
    return bytes(data)


def messages() -> st.SearchStrategy[list[bytes]]:
    """Whole messages: wrong frame counts, wrong seq sizes, and every kind of payload."""
    seqs = st.integers(0, 40).map(seq_frame) | st.binary(max_size=12)
    framed = st.tuples(st.just(TOPIC), seqs, payloads()).map(list)
    counts = st.lists(st.binary(max_size=10), max_size=6)
    return st.one_of(framed, framed, framed, counts)
