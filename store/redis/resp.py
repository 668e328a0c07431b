"""RESP: the bytes of the writer's calls, as Redis reads commands.

Imports neither zmq, fastapi nor redis. The transport sends every write packed here: as one
apply.lua call (`pack_evalsha`) or as a guarded transaction of plain commands
(`pack_transaction`); each command is byte for byte what `hiredis.pack_command` gives for the
same arguments (tests/store/test_redis_resp.py holds it to that) at a fraction of its cost on a
writer's arguments: thousands of set members and a few distinct scores per call, where
hiredis allocates each argument twice and formats each length with `sprintf`
(bench/README.md, ingest_redis.py). Compiled with the mirror (setup.py `NATIVE`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Final

from kvsi.store.redis.layout import as_text
from kvsi.store.redis.plan import COMMANDS, DEL, REMOVE1, SUNIONSTORE, Arg

_HEADS: Final = [f"${n}" for n in range(128)]
"""Bulk-string headers of the common lengths, made once."""

_CRLF: Final = "\r\n"


class _IrregularError(Exception):
    """A str argument with non-ASCII characters (its length in bytes is not its length), or
    a float subclass (rendered by its own repr): packed the plain way."""


def pack_evalsha(sha: str, keys: Sequence[str], args: Sequence[Arg]) -> bytes:
    """`EVALSHA sha len(keys) *keys *args` as RESP. Arguments as hiredis takes them: str
    (UTF-8), bytes, and exact ints and floats (by repr); anything else raises TypeError."""
    try:
        return _evalsha(_Packer(), sha, keys, args)
    except _IrregularError:
        return _evalsha(_PlainPacker(), sha, keys, args)


def _evalsha(packer: _Out, sha: str, keys: Sequence[str], args: Sequence[Arg]) -> bytes:
    packer.head(3 + len(keys) + len(args))
    packer.add(("EVALSHA", sha, len(keys)))
    packer.add(keys)
    packer.add(args)
    return packer.done()


HEAD: Final = 6
"""apply.lua's ARGV before its ops: the write's checks (check.lua)."""


def pack_transaction(guard: str, abort: str, keys: list[str], args: list[Arg]) -> tuple[bytes, int]:
    """apply.lua's call (`keys`, `args`) as a transaction of plain commands, and the number
    of replies it gets: `WATCH vlog abort` (every write of the version pushes to the version
    log), `EVAL guard` (check.lua's checks on meta and version log, `abort` the key it sets
    to refuse), `MULTI`, `EXISTS vlog abort` (refused while queuing wherever the WATCH was
    refused: a cluster's slot that moved or is moving), each op of `args` as the command
    apply.lua would run, `EXEC`."""
    try:
        return _transaction(_Packer(), guard, abort, keys, args)
    except _IrregularError:
        return _transaction(_PlainPacker(), guard, abort, keys, args)


def _transaction(
    packer: _Out, guard: str, abort: str, keys: list[str], args: list[Arg]
) -> tuple[bytes, int]:
    meta, vlog = keys[0], keys[1]
    packer.head(3)
    packer.add(("WATCH", vlog, abort))
    packer.head(6 + HEAD)
    packer.add(("EVAL", guard, 3, meta, vlog, abort))
    packer.add_range(args, 0, HEAD)
    packer.head(1)
    packer.add(("MULTI",))
    packer.head(3)
    packer.add(("EXISTS", vlog, abort))
    replies = 5
    i, k, n = HEAD, 2, len(args)
    while i < n:
        code = args[i]
        count = args[i + 1]
        assert isinstance(code, str) and isinstance(count, int)
        if code == REMOVE1:
            for j in range(count):
                packer.command(_SREM, keys[k + j], 1)
                packer.add_range(args, i + 2 + j, i + 3 + j)
            replies += count
            k += count
            i += 2 + count
        elif code in (DEL, SUNIONSTORE):
            packer.head(1 + count)
            packer.add((COMMANDS[code],))
            packer.add_range(keys, k, k + count)
            replies += 1
            k += count
            i += 2
        else:
            packer.command(_WORDS[code], keys[k], count)
            packer.add_range(args, i + 2, i + 2 + count)
            replies += 1
            k += 1
            i += 2 + count
    packer.head(1)
    packer.add(("EXEC",))
    return packer.done(), replies


def _word(name: str) -> str:
    """A command's name as its bulk string, less the final CRLF."""
    return f"${len(name)}\r\n{name}"


_WORDS: Final = {code: _word(name) for code, name in COMMANDS.items()}
_SREM: Final = _word("SREM")


class _Out:
    """Where commands are packed: `head` starts one of `count` arguments, `add` adds some;
    `command` starts one of a name (its `_word`), a key and `count` arguments more."""

    def head(self, count: int) -> None:
        raise NotImplementedError

    def command(self, word: str, key: str, count: int) -> None:
        raise NotImplementedError

    def add(self, args: Sequence[object]) -> None:
        raise NotImplementedError

    def add_range(self, args: list[str] | list[Arg], start: int, end: int) -> None:
        """`add(args[start:end])`, without the copy."""
        self.add(args[start:end])

    def done(self) -> bytes:
        raise NotImplementedError


class _Packer(_Out):
    """Arguments as text joined by CRLF, encoded once per run of text (a bytes argument
    ends a run); repeated float scores rendered once."""

    __slots__ = ("_last_float", "_last_text", "_out", "_parts")

    def __init__(self) -> None:
        self._out: list[bytes] = []
        self._parts: list[str] = []
        self._last_float = math.nan  # equal to nothing
        self._last_text = ""

    def head(self, count: int) -> None:
        self._parts.append(f"*{count}")

    def command(self, word: str, key: str, count: int) -> None:
        parts = self._parts
        parts.append(f"*{2 + count}")
        parts.append(word)
        n = len(key)
        parts.append(_HEADS[n] if n < 128 else f"${n}")
        parts.append(key)

    def add(self, args: Sequence[object]) -> None:
        for a in args:
            self._arg(a)

    def add_range(self, args: list[str] | list[Arg], start: int, end: int) -> None:
        for i in range(start, end):
            self._arg(args[i])

    def _arg(self, a: object) -> None:
        kind = type(a)  # compared apart from `a`, so that an int is never unboxed
        if kind is int:
            s = as_text(a)
        elif isinstance(a, str):
            s = a
        elif isinstance(a, bytes):
            self._raw(a)
            return
        elif type(a) is float:
            s = self._float(a)
        elif isinstance(a, float):
            raise _IrregularError
        else:
            raise TypeError(f"a RESP argument must be str, int, float or bytes, not {a!r}")
        n = len(s)
        parts = self._parts
        parts.append(_HEADS[n] if n < 128 else f"${n}")
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
        self._out.append(a)
        self._parts = [""]

    def _flush(self) -> None:
        text = _CRLF.join(self._parts)
        data = text.encode()
        if len(data) != len(text):
            raise _IrregularError
        self._out.append(data)

    def done(self) -> bytes:
        self._parts.append("")
        self._flush()
        return b"".join(self._out)


class _PlainPacker(_Out):
    """The plain form, one argument at a time (a non-ASCII str or a float subclass among
    them). `a` is never narrowed to a float here: compiled, that would drop a subclass."""

    __slots__ = ("_out",)

    def __init__(self) -> None:
        self._out = bytearray()

    def head(self, count: int) -> None:
        self._out += f"*{count}\r\n".encode()

    def command(self, word: str, key: str, count: int) -> None:
        self._out += f"*{2 + count}\r\n{word}\r\n".encode()
        self.add((key,))

    def add(self, args: Sequence[object]) -> None:
        out = self._out
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

    def done(self) -> bytes:
        return bytes(self._out)


class UnguardedWriteError(Exception):
    """A transaction's commands ran although its checks did not pass (a guard refused by the
    server, e.g. BUSY, whose commands were queued nonetheless; a refused MULTI, after which
    they ran one by one): what landed was not checked. Never sent again."""


def transaction_reply(replies: Sequence[object]) -> Sequence[object] | None:
    """apply.lua's reply for the replies of a `pack_transaction` call, or None when nothing
    ran and apply.lua should answer instead (a command Redis would not queue; a guard that
    failed: apply.lua runs the same checks, and raises what they raise).

    An error reply of the WATCH is raised when nothing ran (a cluster's MOVED among them),
    as is one among the transaction's commands (the others ran). Commands that ran although
    the WATCH, the guard or the MULTI did not pass raise UnguardedWriteError.
    """
    watch, guard, multi, done = replies[0], replies[1], replies[2], replies[-1]
    passed = isinstance(guard, list) and len(guard) > 4 and not isinstance(watch, Exception)
    if isinstance(multi, Exception) or (isinstance(done, list) and not passed):
        raise UnguardedWriteError(
            f"a write's commands ran without its checks passing: WATCH {watch!r}, "
            f"guard {guard!r}, MULTI {multi!r}"
        )
    if isinstance(watch, Exception):
        raise watch
    if isinstance(done, Exception) or isinstance(guard, Exception):
        return None
    assert isinstance(guard, list)
    if done is None:  # refused by the guard, or another write to the worker came first
        return [b"stale", guard[1], b"", b""] if passed else guard
    assert isinstance(done, list)
    for reply in done:
        if isinstance(reply, Exception):
            raise reply
    return guard[:4]


def take_replies(
    gets: Callable[[], object],
    out: list[object],
    count: int,
    none_yet: object,
    apart: tuple[type, ...],
) -> object:
    """Replies from a RESP reader's `gets` into `out` until it holds `count` (then None) or
    `gets` returns `none_yet` (then that); a reply of a type in `apart` (a push message, a
    connection error) is returned instead of taken, for the caller to handle."""
    while len(out) < count:
        reply = gets()
        if reply is none_yet or isinstance(reply, apart):
            return reply
        out.append(reply)
    return None
