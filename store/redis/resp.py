"""RESP: the bytes of the writer's EVALSHA calls, as Redis reads a command.

Imports neither zmq, fastapi nor redis. The transport sends every apply.lua call packed by
`pack_evalsha`; it gives byte for byte what `hiredis.pack_command` gives for the same
arguments (tests/store/test_redis_resp.py holds it to that) at a fraction of its cost on a
writer's arguments: thousands of set members and a few distinct scores per call, where
hiredis allocates each argument twice and formats each length with `sprintf`
(bench/README.md, ingest_redis.py). Compiled with the mirror (setup.py `NATIVE`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from kvsi.store.redis.layout import as_text
from kvsi.store.redis.plan import Arg

_HEADS: Final = [f"${n}" for n in range(128)]
"""Bulk-string headers of the common lengths, made once."""

_CRLF: Final = "\r\n"


class _IrregularError(Exception):
    """A str argument with non-ASCII characters (its length in bytes is not its length), or
    a float subclass (rendered by its own repr): packed the plain way."""


def pack_evalsha(sha: str, keys: Sequence[str], args: Sequence[Arg]) -> bytes:
    """`EVALSHA sha len(keys) *keys *args` as RESP. Arguments as hiredis takes them: str
    (UTF-8), bytes, and exact ints and floats (by repr); anything else raises TypeError."""
    count = 3 + len(keys) + len(args)
    packer = _Packer(count)
    try:
        packer.add(("EVALSHA", sha, len(keys)))
        packer.add(keys)
        packer.add(args)
        return packer.done()
    except _IrregularError:
        return _pack_each(count, (("EVALSHA", sha, len(keys)), keys, args))


class _Packer:
    """Arguments as text joined by CRLF, encoded once per run of text (a bytes argument
    ends a run); repeated float scores rendered once."""

    __slots__ = ("_last_float", "_last_text", "_out", "_parts")

    def __init__(self, count: int) -> None:
        self._out = bytearray()
        self._parts: list[str] = [f"*{count}"]
        self._last_float = math.nan  # equal to nothing
        self._last_text = ""

    def add(self, args: Sequence[object]) -> None:
        parts = self._parts
        heads = _HEADS
        for a in args:
            kind = type(a)  # compared apart from `a`, so that an int is never unboxed
            if kind is int:
                s = as_text(a)
            elif isinstance(a, str):
                s = a
            elif isinstance(a, bytes):
                self._raw(a)
                parts = self._parts
                continue
            elif type(a) is float:
                s = self._float(a)
            elif isinstance(a, float):
                raise _IrregularError
            else:
                raise TypeError(f"a RESP argument must be str, int, float or bytes, not {a!r}")
            n = len(s)
            parts.append(heads[n] if n < 128 else f"${n}")
            parts.append(s)

    def _float(self, a: float) -> str:
        # -0.0 equals 0.0 but is rendered apart; no other two equal floats differ in repr.
        if a == self._last_float and a != 0.0:
            return self._last_text
        text = repr(a)
        self._last_float = a
        self._last_text = text
        return text

    def _raw(self, a: bytes) -> None:
        parts = self._parts
        parts.append(f"${len(a)}")
        parts.append("")
        self._flush()
        self._out += a
        self._parts = [""]

    def _flush(self) -> None:
        text = _CRLF.join(self._parts)
        data = text.encode()
        if len(data) != len(text):
            raise _IrregularError
        self._out += data

    def done(self) -> bytes:
        self._parts.append("")
        self._flush()
        return bytes(self._out)


def _pack_each(count: int, groups: Sequence[Sequence[object]]) -> bytes:
    """The plain form, one argument at a time (a non-ASCII str or a float subclass among
    them). `a` is never narrowed to a float here: compiled, that would drop a subclass."""
    out = bytearray(f"*{count}\r\n".encode())
    for args in groups:
        for a in args:
            if isinstance(a, str):
                data = a.encode()
            elif isinstance(a, bytes):
                data = a
            elif isinstance(a, float) or type(a) is int:
                data = repr(a).encode()
            else:
                raise TypeError(f"a RESP argument must be str, int, float or bytes, not {a!r}")
            out += f"${len(data)}\r\n".encode()
            out += data
            out += b"\r\n"
    return bytes(out)
