"""Payload encodings that vLLM 0.33 digests: pickle protocol 5 and canonical CBOR.

Imports the standard library only (not pickle, not cbor2): both formats are spelled out here.

Both encoders take exactly the value types block hashing produces (None, bool, int, bytes, str
and tuples of them) and reject anything else, subclasses included: a NumPy integer or a str
subclass pickles to other bytes, and a hash that silently differs is worse than an error.

The pickle bytes follow HASHING.md §3.1 instead of calling `pickle.dumps`, so the payload is
what CPython 3.8-3.13 write whichever Python runs this code: an index on a newer Python must
still agree with engines on 3.11. The CBOR encoder follows §3.2, so cbor2 is no dependency.
"""

from __future__ import annotations

import struct
from typing import TypeAlias

HashValue: TypeAlias = "bool | int | bytes | str | tuple[HashValue, ...] | None"
"""A value that can appear in a hashed object (block tuples and the NONE_HASH seed)."""

_FRAME_SIZE_TARGET = 65536
"""CPython closes the open frame before a value once it holds this many bytes, and writes str
or bytes data this long or longer outside any frame."""

_MIN_FRAME_WITH_HEADER = 4
"""CPython writes a frame shorter than this without its 9-byte header."""

_TUPLE_OPCODES = {1: b"\x85", 2: b"\x86", 3: b"\x87"}
"""TUPLE1..TUPLE3; longer tuples use MARK ... TUPLE, the empty one EMPTY_TUPLE."""


_BININT1 = tuple(b"K" + bytes((value,)) for value in range(256))
"""Every BININT1 opcode, prebuilt: token ids are written one by one, so this is the hot path."""

_pack_binint2 = struct.Struct("<BH").pack
_pack_binint = struct.Struct("<Bi").pack


def _pickle_int(value: int) -> bytes:
    """The opcode for one int: the shortest of BININT1, BININT2, BININT, LONG1, LONG4."""
    if 0 <= value <= 0xFF:
        return _BININT1[value]
    if 0 <= value <= 0xFFFF:
        return _pack_binint2(0x4D, value)
    if -(2**31) <= value < 2**31:
        return _pack_binint(0x4A, value)
    # Minimal two's complement: the magnitude's bits plus one sign bit, rounded up to bytes.
    size = (value if value >= 0 else ~value).bit_length() // 8 + 1
    data = value.to_bytes(size, "little", signed=True)
    if size <= 0xFF:
        return b"\x8a" + size.to_bytes(1, "little") + data
    return b"\x8b" + size.to_bytes(4, "little") + data


class _PickleWriter:
    """One protocol-5 dump: what is written so far, the open frame, and the memo.

    The memo is keyed by object identity, as CPython's is: a str, bytes or tuple object met a
    second time becomes a BINGET, an equal but distinct object is written again. Callers that
    need vLLM's bytes must build their objects with vLLM's identities (blocks.py does).
    """

    __slots__ = ("_frame", "_memo", "_out")

    def __init__(self) -> None:
        self._out = bytearray(b"\x80\x05")
        self._frame = bytearray()
        self._memo: dict[int, int] = {}

    def dump(self, value: HashValue) -> bytes:
        self._save(value)
        self._frame += b"."
        self._commit_frame()
        return bytes(self._out)

    def _commit_frame(self) -> None:
        frame = self._frame
        if len(frame) >= _MIN_FRAME_WITH_HEADER:
            self._out += b"\x95" + len(frame).to_bytes(8, "little")
        self._out += frame
        frame.clear()

    def _save(self, value: HashValue) -> None:
        if len(self._frame) >= _FRAME_SIZE_TARGET:
            self._commit_frame()
        if type(value) is int:
            self._frame += _pickle_int(value)
        elif value is None:
            self._frame += b"N"
        elif type(value) is bool:
            self._frame += b"\x88" if value else b"\x89"
        elif type(value) is tuple or type(value) is str or type(value) is bytes:
            index = self._memo.get(id(value))
            if index is None:
                self._save_new(value)
            elif index <= 0xFF:
                self._frame += b"h" + index.to_bytes(1, "little")
            else:
                self._frame += b"j" + index.to_bytes(4, "little")
        else:
            raise TypeError(
                f"cannot serialize {type(value).__qualname__}: only None, bool, int, bytes, "
                "str and tuples of them (exact types, no subclasses)"
            )

    def _save_new(self, value: tuple[HashValue, ...] | str | bytes) -> None:
        if isinstance(value, tuple):
            if not value:
                self._frame += b")"  # EMPTY_TUPLE, never memoized
                return
            opcode = _TUPLE_OPCODES.get(len(value))
            if opcode is None:
                self._frame += b"("
            frame = self._frame
            for item in value:
                # _save inlined for ints: a token tuple is the bulk of every block payload.
                if type(item) is int and len(frame) < _FRAME_SIZE_TARGET:
                    frame += _pickle_int(item)
                else:
                    self._save(item)
            self._frame += b"t" if opcode is None else opcode
        else:
            if isinstance(value, str):
                data = value.encode("utf-8", "surrogatepass")
                short, long = b"\x8c", b"X"  # SHORT_BINUNICODE, BINUNICODE
            else:
                data = value
                short, long = b"C", b"B"  # SHORT_BINBYTES, BINBYTES
            if len(data) <= 0xFF:
                head = short + len(data).to_bytes(1, "little")
            else:
                head = long + len(data).to_bytes(4, "little")
            if len(data) >= _FRAME_SIZE_TARGET:
                self._commit_frame()
                self._out += head + data
            else:
                self._frame += head + data
        self._memo[id(value)] = len(self._memo)
        self._frame += b"\x94"


def pickle_dumps(value: HashValue) -> bytes:
    """`pickle.dumps(value, protocol=5)` as CPython 3.8-3.13 write it, for hashable values."""
    return _PickleWriter().dump(value)


def _cbor_head(major: int, argument: int) -> bytes:
    """An RFC 8949 head in its shortest form (canonical CBOR requires it)."""
    initial = major << 5
    if argument < 24:
        return bytes((initial | argument,))
    if argument <= 0xFF:
        return bytes((initial | 24, argument))
    if argument <= 0xFFFF:
        return bytes((initial | 25,)) + argument.to_bytes(2, "big")
    if argument <= 0xFFFFFFFF:
        return bytes((initial | 26,)) + argument.to_bytes(4, "big")
    return bytes((initial | 27,)) + argument.to_bytes(8, "big")


def _cbor_write(out: bytearray, value: HashValue) -> None:
    if type(value) is int:
        major, magnitude = (0, value) if value >= 0 else (1, -1 - value)
        if magnitude < 2**64:
            out += _cbor_head(major, magnitude)
        else:
            # Bignum: tag 2 (positive) or 3 (negative) over the big-endian magnitude.
            data = magnitude.to_bytes((magnitude.bit_length() + 7) // 8, "big")
            out += _cbor_head(6, 2 + major) + _cbor_head(2, len(data)) + data
    elif value is None:
        out += b"\xf6"
    elif type(value) is bool:
        out += b"\xf5" if value else b"\xf4"
    elif type(value) is bytes:
        out += _cbor_head(2, len(value)) + value
    elif type(value) is str:
        data = value.encode("utf-8")
        out += _cbor_head(3, len(data)) + data
    elif type(value) is tuple:
        out += _cbor_head(4, len(value))
        for item in value:
            _cbor_write(out, item)
    else:
        raise TypeError(
            f"cannot serialize {type(value).__qualname__}: only None, bool, int, bytes, "
            "str and tuples of them (exact types, no subclasses)"
        )


def cbor_dumps(value: HashValue) -> bytes:
    """`cbor2.dumps(value, canonical=True)` for hashable values: no memo, shortest heads."""
    out = bytearray()
    _cbor_write(out, value)
    return bytes(out)
