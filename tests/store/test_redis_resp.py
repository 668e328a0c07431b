"""The apply calls' RESP packing: hiredis' bytes exactly, and what Redis reads from them."""

from __future__ import annotations

import enum
import socket
from typing import Any

import hiredis
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsi.store.redis.plan import COMMANDS, DEL, REMOVE1, SUNIONSTORE, Arg
from kvsi.store.redis.resp import (
    UnguardedWriteError,
    pack_evalsha,
    pack_transaction,
    take_replies,
    transaction_reply,
)
from tests.redis_servers import RedisServer

SHA = "0123456789abcdef0123456789abcdef01234567"

FLOATS = st.sampled_from([0.0, -0.0, 1000.0, 1e300, -1e-300, 0.1, float("inf"), float("nan")])
ARGS: st.SearchStrategy[Arg] = st.one_of(
    st.text(max_size=200),
    st.text(alphabet="abc{}:/-0123456789", max_size=140),  # keys: ASCII, lengths past 128
    st.binary(max_size=40),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    FLOATS,
)


def hiredis_packed(keys: list[str], args: list[Arg]) -> bytes:
    packed: bytes = hiredis.pack_command(("EVALSHA", SHA, len(keys), *keys, *args))
    return packed


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(max_size=60), max_size=5), st.lists(ARGS, max_size=60))
def test_packs_what_hiredis_packs(keys: list[str], args: list[Arg]) -> None:
    assert pack_evalsha(SHA, keys, args) == hiredis_packed(keys, args)


@pytest.mark.parametrize(
    "args",
    [
        [],
        [b""],
        [b"\x00\xff", "tail"],
        ["x", b"raw", b"raw2", 5],
        [1000.0, 1000.0, -0.0, 0.0, -0.0, float("nan"), float("nan"), 1000.0],
        [2**64 - 59, -(2**63), "é", "日本", b"\xe9"],
        ["a" * 127, "b" * 128, "c" * 5000, 10**40],
    ],
)
def test_edges_pack_as_hiredis(args: list[Arg]) -> None:
    assert pack_evalsha(SHA, ["P:{pod/0}:m", "ключ"], args) == hiredis_packed(
        ["P:{pod/0}:m", "ключ"], args
    )


class Code(enum.IntEnum):
    ONE = 1


class Score(float):
    def __repr__(self) -> str:
        return "7.5e0"


@pytest.mark.parametrize(
    "args", [[Score(7.5)], [1000.0, Score(1000.0), 1000.0], ["é", Score(2.0)]], ids=repr
)
def test_a_float_subclass_is_packed_by_its_own_repr_as_hiredis(args: list[Arg]) -> None:
    assert pack_evalsha(SHA, [], args) == hiredis_packed([], args)


@pytest.mark.parametrize("bad", [True, Code.ONE, None, [1], bytearray(b"x")])
def test_refuses_what_hiredis_refuses(bad: Any) -> None:
    with pytest.raises(TypeError):
        hiredis.pack_command(("EVALSHA", SHA, 0, bad))
    with pytest.raises(TypeError, match="must be str, int, float or bytes"):
        pack_evalsha(SHA, [], ["ok", bad])


@pytest.mark.redis
def test_redis_reads_the_arguments_back(redis_server: RedisServer) -> None:
    """A real server runs the packed call: every key and argument arrives as sent."""
    client: redis.Redis = redis_server.client()
    echo = (
        "local out = {} for _, k in ipairs(KEYS) do out[#out + 1] = k end "
        "for _, a in ipairs(ARGV) do out[#out + 1] = a end return out"
    )
    sha = client.script_load(echo)
    keys = ["{w}:é", "{w}:" + "k" * 200]
    args: list[Arg] = ["日本", b"\x00\xff\r\n", 2**63 - 1, -5, 1000.0, 1000.0, -0.0, "z" * 130]
    with socket.create_connection(("127.0.0.1", redis_server.port), timeout=5) as sock:
        sock.sendall(pack_evalsha(sha, keys, args))
        reader = hiredis.Reader()
        reply: Any = False
        while reply is False:
            reader.feed(sock.recv(65536))
            reply = reader.gets()
    assert reply == [
        "{w}:é".encode(),
        b"{w}:" + b"k" * 200,
        "日本".encode(),
        b"\x00\xff\r\n",
        b"9223372036854775807",
        b"-5",
        b"1000.0",
        b"1000.0",
        b"-0.0",
        b"z" * 130,
    ]


# -- a write as a transaction: pack_transaction, transaction_reply ------------------------

GUARD = "return 1"
ABORT = "P:{pod/0}:meta:abort:x"
CHECK_ARGS: list[Arg] = ["batch", 7, 1.5, "v1", "applied", ""]
OPS = st.one_of(
    st.tuples(st.sampled_from(sorted(set(COMMANDS) - {DEL, SUNIONSTORE})), st.lists(ARGS)),
    st.tuples(st.sampled_from([DEL, SUNIONSTORE]), st.integers(1, 4)),
    st.tuples(st.just(REMOVE1), st.lists(ARGS, min_size=1, max_size=4)),
)


def _call(ops: list[tuple[str, Any]]) -> tuple[list[str], list[Arg], list[tuple[object, ...]]]:
    """apply.lua's KEYS and ARGV for `ops`, and the commands apply.lua would run for them."""
    keys = ["P:{pod/0}:meta", "P:{pod/0}:vlog"]
    args: list[Arg] = list(CHECK_ARGS)
    commands: list[tuple[object, ...]] = []
    for code, what in ops:
        if code in (DEL, SUNIONSTORE):
            named = [f"P:{{pod/0}}:k{len(keys) + j}" for j in range(what)]
            args += [code, what]
            commands.append((COMMANDS[code], *named))
            keys += named
        elif code == REMOVE1:
            named = [f"P:{{pod/0}}:s{len(keys) + j}" for j in range(len(what))]
            args += [code, len(what), *what]
            commands += [("SREM", k, a) for k, a in zip(named, what, strict=True)]
            keys += named
        else:
            key = f"P:{{pod/0}}:{'ключ' if len(keys) % 2 else 'k'}{len(keys)}"
            args += [code, len(what), *what]
            commands.append((COMMANDS[code], key, *what))
            keys.append(key)
    return keys, args, commands


@settings(max_examples=300, deadline=None)
@given(st.lists(OPS, max_size=8))
def test_a_transaction_packs_apply_luas_commands_as_hiredis(ops: list[tuple[str, Any]]) -> None:
    """Each op becomes the very command apply.lua runs for it, between the guard and EXEC."""
    keys, args, commands = _call(ops)
    expected = [
        ("WATCH", keys[1], ABORT),
        ("EVAL", GUARD, 3, keys[0], keys[1], ABORT, *CHECK_ARGS),
        ("MULTI",),
        ("EXISTS", keys[1], ABORT),
        *commands,
        ("EXEC",),
    ]
    packed, replies = pack_transaction(GUARD, ABORT, keys, args)
    assert packed == b"".join(hiredis.pack_command(c) for c in expected)
    assert replies == len(expected)


class Refused(Exception):
    """An error reply, as the reader hands it over (not raised)."""


APPLIED = [b"applied", b"v1", b"", b"", 1]
OK, QUEUED = b"OK", b"QUEUED"


@pytest.mark.parametrize(
    ("replies", "expected"),
    [
        ([OK, APPLIED, OK, QUEUED, QUEUED, [1, 1]], [b"applied", b"v1", b"", b""]),
        ([OK, [b"stale", b"v0", b"", b""], OK, QUEUED, QUEUED, None], [b"stale", b"v0", b"", b""]),
        (
            [OK, [b"duplicate", b"v2", b"v3", b"b"], OK, QUEUED, None],
            [b"duplicate", b"v2", b"v3", b"b"],
        ),
        ([OK, APPLIED, OK, QUEUED, QUEUED, None], [b"stale", b"v1", b"", b""]),
        ([OK, APPLIED, OK, QUEUED, Refused("OOM"), Refused("EXECABORT")], None),
        ([OK, Refused("OOM"), OK, QUEUED, Refused("OOM"), Refused("EXECABORT")], None),
        ([OK, Refused("WRONGTYPE"), OK, QUEUED, QUEUED, None], None),
        ([OK, Refused("BUSY"), OK, QUEUED, QUEUED, None], None),
    ],
    ids=[
        "ran",
        "refused",
        "duplicate",
        "another-write-first",
        "not-queued",
        "guard-oom",
        "guard-raised",
        "guard-busy-another-write-first",
    ],
)
def test_a_transactions_replies_read_as_apply_luas(replies: list[Any], expected: Any) -> None:
    assert transaction_reply(replies) == expected


def test_a_transactions_error_replies_raise() -> None:
    moved = Refused("MOVED")
    with pytest.raises(Refused, match="MOVED"):
        transaction_reply([moved, moved, OK, moved, Refused("EXECABORT")])
    with pytest.raises(Refused, match="WRONGTYPE"):
        transaction_reply([OK, APPLIED, OK, QUEUED, QUEUED, [1, 1, Refused("WRONGTYPE")]])


@pytest.mark.parametrize(
    "replies",
    [
        [OK, Refused("BUSY"), OK, QUEUED, QUEUED, [1, 1]],
        [Refused("TRYAGAIN"), Refused("TRYAGAIN"), OK, QUEUED, QUEUED, [0, 1]],
        [OK, [b"stale", b"v0", b"", b""], OK, QUEUED, QUEUED, [1, 1]],
        [OK, APPLIED, Refused("MULTI nested"), 1, 1, Refused("EXEC without MULTI")],
        [Refused("CLUSTERDOWN"), APPLIED, OK, QUEUED, QUEUED, [0, 1]],
    ],
    ids=["guard-busy", "watch-refused", "refused-yet-ran", "multi-refused", "unwatched"],
)
def test_commands_that_ran_unchecked_raise(replies: list[Any]) -> None:
    """Never read as an outcome, never sent again: what landed was not checked."""
    with pytest.raises(UnguardedWriteError):
        transaction_reply(replies)


class Push(list[object]):
    """A push message, as hiredis gives one (a list of its own type)."""


def test_replies_are_taken_until_counted_or_wanting_with_the_odd_one_handed_back() -> None:
    wanting = object()
    stream = iter([b"QUEUED", [1, 2], Push([b"invalidate"]), Refused("E"), wanting, b"x"])
    out: list[object] = [b"OK"]
    assert isinstance(take_replies(stream.__next__, out, 9, wanting, (Push,)), Push)
    assert out == [b"OK", b"QUEUED", [1, 2]]
    assert take_replies(stream.__next__, out, 9, wanting, (Push,)) is wanting
    assert out[3:] == [out[3]] and isinstance(out[3], Refused)  # an error reply is a reply
    assert take_replies(stream.__next__, out, 5, wanting, (Push,)) is None
    assert out[4:] == [b"x"]
