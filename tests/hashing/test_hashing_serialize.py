"""The payload encoders: byte-exact against CPython's pickler, cbor2 and RFC 8949's examples.

Cross-checking against `pickle.dumps` on the running Python also raises the alarm if a new
CPython ever changes protocol 5's bytes: engines on that Python would then hash differently.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsi.hashing.serialize import HashValue, cbor_dumps, pickle_dumps

scalars = st.none() | st.booleans() | st.integers() | st.binary() | st.text()
values: st.SearchStrategy[HashValue] = st.recursive(
    scalars, lambda children: st.lists(children, max_size=6).map(tuple), max_leaves=40
)
big_ints = st.integers(min_value=-(2**2100), max_value=2**2100)


@st.composite
def shared_objects(draw: st.DrawFn) -> HashValue:
    """A tuple that reuses some of its objects, so the memo must work by identity."""
    pool = draw(st.lists(values, min_size=1, max_size=5))
    picks = draw(st.lists(st.integers(0, len(pool) - 1), max_size=12))
    return tuple(pool[i] for i in picks)


@settings(max_examples=400)
@given(values | big_ints)
def test_pickle_equals_cpython_protocol_5(value: HashValue) -> None:
    assert pickle_dumps(value) == pickle.dumps(value, protocol=5)


@settings(max_examples=200)
@given(shared_objects())
def test_pickle_memo_by_identity_equals_cpython(value: HashValue) -> None:
    assert pickle_dumps(value) == pickle.dumps(value, protocol=5)


def test_repeated_object_is_a_binget_and_an_equal_copy_is_written_again() -> None:
    tag = "mm"
    other = b"mm".decode()  # equal, distinct object
    assert other is not tag
    shared = pickle_dumps(((tag, "id-1", 3), (tag, "id-2", 5)))
    assert b"h\x00" in shared  # BINGET 0: the first "mm"
    assert shared.count(b"\x8c\x02mm") == 1
    assert pickle_dumps(((tag, "id-1", 3), (other, "id-2", 5))).count(b"\x8c\x02mm") == 2


def test_memo_index_past_255_uses_long_binget() -> None:
    strings = tuple(f"s{i}" for i in range(300))
    value = (*strings, strings[0], strings[299])
    dumped = pickle_dumps(value)
    assert dumped == pickle.dumps(value, protocol=5)
    assert b"j" + (299).to_bytes(4, "little") in dumped


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(tuple([1] * n), id=f"{n}-small-ints")
        for n in (32760, 32766, 32767, 32768, 32769, 32770, 70000)
    ]
    + [pytest.param(tuple(range(n)), id=f"range-{n}") for n in (21800, 21846, 21847, 40000)]
    + [
        pytest.param(b"x" * 65535, id="bytes-65535-framed"),
        pytest.param(b"x" * 65536, id="bytes-65536-unframed"),
        pytest.param("é" * 32768, id="str-65536-utf8-bytes-unframed"),
        pytest.param((1, b"x" * 65536), id="short-frame-without-header"),
        pytest.param((b"x" * 65536, 1, 2, 3), id="unframed-then-frame"),
        pytest.param(((1,) * 40000, b"y" * 70000, (2,) * 3), id="frames-around-unframed"),
        pytest.param(("a" * 65530, "b" * 10), id="frame-closed-before-second-str"),
    ],
)
def test_pickle_frames_equal_cpython_at_64k_edges(value: HashValue) -> None:
    assert pickle_dumps(value) == pickle.dumps(value, protocol=5)


@pytest.mark.parametrize(
    ("value", "expected_hex"),
    [
        (0, "00"),
        (23, "17"),
        (24, "1818"),
        (100, "1864"),
        (1000, "1903e8"),
        (1000000, "1a000f4240"),
        (1000000000000, "1b000000e8d4a51000"),
        (18446744073709551615, "1bffffffffffffffff"),
        (18446744073709551616, "c249010000000000000000"),
        (-18446744073709551616, "3bffffffffffffffff"),
        (-18446744073709551617, "c349010000000000000000"),
        (-1, "20"),
        (-10, "29"),
        (-100, "3863"),
        (-1000, "3903e7"),
        (False, "f4"),
        (True, "f5"),
        (None, "f6"),
        (b"", "40"),
        (b"\x01\x02\x03\x04", "4401020304"),
        ("", "60"),
        ("a", "6161"),
        ("IETF", "6449455446"),
        ('"\\', "62225c"),
        ("\u00fc", "62c3bc"),
        ("\u6c34", "63e6b0b4"),
        ((), "80"),
        ((1, 2, 3), "83010203"),
        ((1, (2, 3), (4, 5)), "8301820203820405"),
        (tuple(range(1, 26)), "98190102030405060708090a0b0c0d0e0f101112131415161718181819"),
    ],
)
def test_cbor_equals_rfc_8949_examples(value: HashValue, expected_hex: str) -> None:
    assert cbor_dumps(value).hex() == expected_hex


@settings(max_examples=400)
@given(values | big_ints | shared_objects())
def test_cbor_equals_cbor2_canonical(value: HashValue) -> None:
    cbor2 = pytest.importorskip("cbor2")
    assert cbor_dumps(value) == cbor2.dumps(value, canonical=True)


class _Token(int):
    """An int subclass, standing in for any integer type that is not exactly int."""


@pytest.mark.parametrize("dumps", [pickle_dumps, cbor_dumps])
@pytest.mark.parametrize("value", [1.0, [1, 2], _Token(3), (1, {"a": 1}), bytearray(b"x")])
def test_encoders_reject_other_types(dumps: Callable[[Any], bytes], value: object) -> None:
    with pytest.raises(TypeError, match="cannot serialize"):
        dumps(value)
