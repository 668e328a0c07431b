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

from kvsi.store.redis.plan import Arg
from kvsi.store.redis.resp import pack_evalsha
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
