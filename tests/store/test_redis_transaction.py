"""A write as a guarded transaction (store/redis/transport.py): `WATCH meta abort`, `EVAL
guard.lua`, `MULTI`, the plain commands, `EXEC`. Its writes land all at once after the
checks passed, and never otherwise: a refusal, a failing guard, another write between the
guard and EXEC, a command Redis refuses to queue. On a real server, through the store's own
transport."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import hiredis
import pytest
import redis
import redis.exceptions
from redis.crc import key_slot

from kvsi.store.model import Batch, EntriesStored, WorkerKey
from kvsi.store.redis import RedisStore, transport
from kvsi.store.redis.plan import DEL, SADD, Arg
from kvsi.store.redis.reads import write_script
from kvsi.store.redis.resp import UnguardedWriteError, pack_transaction, transaction_reply
from kvsi.store.redis.transport import DirectScript
from tests.redis_servers import RedisClusterServers, RedisServer
from tests.store.conftest import MakeStore
from tests.store.test_redis_node_reads import node_of

pytestmark = pytest.mark.redis

WORKER = WorkerKey("pod-tx", 0)


async def _written(store: RedisStore) -> tuple[DirectScript, list[str], str]:
    """The store's transport, the worker's meta and version log keys, and its version after
    one batch."""
    await store.apply(WORKER, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s")]))
    direct = store._direct
    assert isinstance(direct, DirectScript)
    keys = store.worker_keys(WORKER)
    ver = (await store._client.hget(keys.meta, "ver") or b"").decode()
    assert ver
    return direct, [keys.meta, keys.vlog], ver


def _op(keys: list[str], target: str, members: list[Arg], ver: str) -> tuple[list[str], list[Arg]]:
    """An op-mode call expecting version `ver`: SADD `members` to `target`."""
    return [*keys, target], ["op", "", "", ver, "applied", "", SADD, len(members), *members]


async def test_a_write_lands_after_its_checks_and_not_otherwise(
    make_store: MakeStore, raw: redis.Redis
) -> None:
    store = await make_store()
    direct, keys, ver = await _written(store)
    target = keys[0] + ":x"
    stale = await direct(*_op(keys, target, [5], "not-" + ver))
    assert stale[0] == b"stale" and stale[1] == ver.encode()
    assert not raw.exists(target)
    ran = await direct(*_op(keys, target, [5, 6], ver))
    assert ran[0] == b"applied"
    assert raw.smembers(target) == {b"5", b"6"}


async def test_a_guard_that_fails_writes_nothing(make_store: MakeStore, raw: redis.Redis) -> None:
    """check.lua raising (its meta is not a hash): the error comes back, the EXEC runs nothing."""
    store = await make_store()
    direct, keys, ver = await _written(store)
    raw.delete(keys[0])
    raw.set(keys[0], "not a hash")
    target = keys[0] + ":x"
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await direct(*_op(keys, target, [5], ver))
    assert not raw.exists(target)
    assert await direct(*_op([keys[0] + "2", keys[1]], target, [7], "")) is not None  # carries on


async def test_the_abort_key_is_gone_at_once(make_store: MakeStore, raw: redis.Redis) -> None:
    store = await make_store()
    direct, keys, _ = await _written(store)
    for _ in range(5):
        assert (await direct(*_op(keys, keys[0] + ":x", [5], "old")))[0] == b"stale"
    await asyncio.sleep(0.05)
    assert raw.keys(keys[0] + ":abort:*") == []


def _in_two_parts(
    port: int,
    packed: bytes,
    count: int,
    meanwhile: Callable[[], object],
    *,
    checked: bool = True,
) -> list[Any]:
    """Send a transaction's bytes in two parts, the guard and MULTI in the first, running
    `meanwhile` in between (once the checks passed, if `checked`); its replies."""
    cut = packed.index(b"MULTI") + len(b"MULTI\r\n")
    reader = hiredis.Reader(replyError=redis.exceptions.ResponseError)
    replies: list[Any] = []
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for part, until in ((packed[:cut], 3), (packed[cut:], count)):
            sock.sendall(part)
            while len(replies) < until:
                reader.feed(sock.recv(65536))
                while (reply := reader.gets()) is not False:
                    replies.append(reply)
            if until == 3:
                assert not checked or replies[1][0] == b"applied"  # the checks passed
                meanwhile()
    return replies


async def test_another_write_between_the_guard_and_exec_aborts_it(
    redis_server: RedisServer, raw: redis.Redis, make_store: MakeStore
) -> None:
    """Another write of the worker's version (which pushes to its log) between the guard and
    the EXEC: the EXEC runs nothing, the call reads "stale"."""
    store = await make_store()
    _, keys, ver = await _written(store)
    target = keys[0] + ":x"
    call_keys, args = _op(keys, target, [5], ver)
    packed, count = pack_transaction(write_script("guard"), keys[0] + ":abort:t", call_keys, args)

    def another_write() -> None:
        raw.hset(keys[0], "ver", "another")
        raw.lpush(keys[1], f"{ver} another x")

    replies = _in_two_parts(redis_server.port, packed, count, another_write)
    assert replies[-1] is None
    assert transaction_reply(replies) == [b"stale", ver.encode(), b"", b""]
    assert not raw.exists(target)


async def test_a_status_between_the_guard_and_exec_does_not_abort_it(
    redis_server: RedisServer, raw: redis.Redis, make_store: MakeStore
) -> None:
    """Meta fields no write's checks read (status, marks) change meanwhile: the write runs."""
    store = await make_store()
    _, keys, ver = await _written(store)
    target = keys[0] + ":x"
    call_keys, args = _op(keys, target, [5], ver)
    packed, count = pack_transaction(write_script("guard"), keys[0] + ":abort:t", call_keys, args)
    replies = _in_two_parts(
        redis_server.port, packed, count, lambda: raw.hset(keys[0], "state", "ingesting")
    )
    assert transaction_reply(replies) == [b"applied", ver.encode(), b"", b""]
    assert raw.smembers(target) == {b"5"}


async def test_a_refusals_key_aborts_a_later_transaction_that_watches_it(
    redis_server: RedisServer, raw: redis.Redis, make_store: MakeStore
) -> None:
    """Why each call has an abort key of its own: a refusal's key, still set when a later
    call watches it and expiring before that call's EXEC, aborts the later call (here the
    key lives 50 ms, not guard.lua's 1, so that it is surely set at the WATCH)."""
    store = await make_store()
    _, keys, ver = await _written(store)
    target = keys[0] + ":x"
    shared = keys[0] + ":abort:shared"
    write, count = pack_transaction(write_script("guard"), shared, *_op(keys, target, [6], ver))
    raw.set(shared, "1", px=50)
    replies = _in_two_parts(redis_server.port, write, count, lambda: time.sleep(0.1))
    assert replies[-1] is None
    assert not raw.exists(target)


async def test_each_call_watches_an_abort_key_of_its_own(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await make_store()
    direct, keys, ver = await _written(store)
    used: list[str] = []

    def recorded(guard: str, abort: str, *call: Any) -> tuple[bytes, int]:
        used.append(abort)
        return pack_transaction(guard, abort, *call)

    monkeypatch.setattr(transport, "pack_transaction", recorded)
    for members in ([5], [6]):
        await direct(*_op(keys, keys[0] + ":x", members, "old"))
        await direct(*_op(keys, keys[0] + ":x", members, ver))
    assert len(set(used)) == 4
    assert {key_slot(k.encode()) for k in used} == {key_slot(keys[0].encode())}


@contextlib.asynccontextmanager
async def _out_of_memory() -> AsyncIterator[tuple[DirectScript, list[str], str, redis.Redis]]:
    """`_written` on a private server, which then has no memory left (maxmemory 1,
    noeviction); and a client on it."""
    server = RedisServer()
    server.start()
    store = RedisStore.from_url(f"{server.url}?prefix=t")
    try:
        direct, keys, ver = await _written(store)
        client = server.client()
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
        yield direct, keys, ver, client
    finally:
        await store.close()
        server.stop()


async def test_a_command_redis_will_not_queue_sends_the_call_as_apply_lua() -> None:
    """Out of memory: the guard passes, the SADD is not queued, the EXEC runs nothing; the
    call goes again as apply.lua, whose own write is refused, and that error comes back."""
    async with _out_of_memory() as (direct, keys, ver, client):
        target = keys[0] + ":x"
        with pytest.raises(redis.exceptions.ResponseError, match="> 'maxmemory'"):
            await direct(*_op(keys, target, [5], ver))
        client.config_set("maxmemory", "0")
        assert not client.exists(target)
        stats = client.info("commandstats")
        assert stats["cmdstat_sadd"]["rejected_calls"] >= 1  # not queued
        exec_ = stats["cmdstat_exec"]
        assert exec_["rejected_calls"] + exec_["failed_calls"] >= 1  # EXECABORT
        assert stats["cmdstat_evalsha"]["failed_calls"] >= 1  # apply.lua's refused write
        assert (await direct(*_op(keys, target, [5], ver)))[0] == b"applied"
        assert client.smembers(target) == {b"5"}


async def test_a_flushed_script_cache_leaves_every_write_guarded(
    make_store: MakeStore, raw: redis.Redis
) -> None:
    """The guard goes as EVAL, never EVALSHA: no NOSCRIPT can let the writes run unchecked."""
    store = await make_store()
    direct, keys, ver = await _written(store)
    raw.script_flush()
    target = keys[0] + ":x"
    assert (await direct(*_op(keys, target, [5], "old")))[0] == b"stale"
    assert not raw.exists(target)
    assert (await direct(*_op(keys, target, [5], ver)))[0] == b"applied"


@pytest.mark.cluster
async def test_on_a_cluster_a_moving_slot_refuses_the_whole_transaction(
    make_store: MakeStore, redis_cluster: RedisClusterServers
) -> None:
    """The worker's slot starts moving (its keys still on the source, the abort key not):
    the WATCH and the guard are answered TRYAGAIN, and the queued EXISTS of the same keys
    refuses the EXEC, so writes to keys still there do not run unchecked."""
    store = await make_store(redis_cluster.url)
    await store.apply(WORKER, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s")]))
    keys = store.worker_keys(WORKER)
    target = keys.meta + ":x"
    slot = key_slot(keys.meta.encode())
    source, source_id = node_of(redis_cluster, slot)
    source.sadd(target, 1)
    ver = source.hget(keys.meta, "ver")
    port = source.connection_pool.connection_kwargs["port"]
    other = next(n for n in redis_cluster.nodes if n.port != port).client()
    other_id = other.execute_command("CLUSTER", "MYID").decode()
    other.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", other_id)
    try:
        call_keys, args = _op([keys.meta, keys.vlog], target, [5], "refuse me")
        packed, count = pack_transaction(
            write_script("guard"), keys.meta + ":abort:t", call_keys, args
        )
        replies = _in_two_parts(port, packed, count, lambda: None, checked=False)
        with pytest.raises(redis.exceptions.ResponseError, match="TRYAGAIN"):
            transaction_reply(replies)
        assert isinstance(replies[-1], redis.exceptions.ResponseError)  # EXECABORT
        assert source.smembers(target) == {b"1"}
        assert source.hget(keys.meta, "ver") == ver
        # Without the EXISTS, the write to a key still on the source runs unchecked:
        exists = hiredis.pack_command(("EXISTS", keys.vlog, keys.meta + ":abort:t"))
        bare = packed.replace(exists, b"", 1)
        replies = _in_two_parts(port, bare, count - 1, lambda: None, checked=False)
        with pytest.raises(UnguardedWriteError):
            transaction_reply(replies)
        assert source.smembers(target) == {b"1", b"5"}
    finally:
        for c in (source, other):
            c.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
            c.close()


async def test_a_cancelled_transaction_does_not_shift_the_replies(make_store: MakeStore) -> None:
    """Transactions of several workers pipelined on one connection, every other one
    cancelled once sent: each other call still gets its own worker's replies."""
    store = await make_store()
    workers = [WorkerKey(f"pod-c{i}", 0) for i in range(8)]
    calls = []
    for w in workers:
        await store.apply(w, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s")]))
        keys = store.worker_keys(w)
        ver = (await store._client.hget(keys.meta, "ver") or b"").decode()
        calls.append((_op([keys.meta, keys.vlog], keys.meta + ":x", list(range(500)), ver), ver))
    direct = store._direct
    assert isinstance(direct, DirectScript)
    for _ in range(5):
        sent = [asyncio.ensure_future(direct(*call)) for call, _ in calls]
        await asyncio.sleep(0)
        for fut in sent[::2]:
            fut.cancel()
        for fut, (_, ver) in list(zip(sent, calls, strict=True))[1::2]:
            assert await fut == [b"applied", ver.encode(), b"", b""]
    await asyncio.gather(*sent, return_exceptions=True)
    assert direct._pipe is not None and not direct._pipe.dead


async def test_out_of_memory_a_refused_removal_deletes_nothing() -> None:
    """A worker's removal is DELs alone, which a plain client may run out of memory; the
    guard's refusal (a stale mirror) cannot set its abort key then, but Redis queues no
    command of a transaction out of memory, so the EXEC runs nothing."""
    async with _out_of_memory() as (direct, keys, ver, client):
        call = ([*keys, *keys], ["op", "", "", "not-" + ver, "applied", "", DEL, 2])
        assert (await direct(*call))[0] == b"stale"
        client.config_set("maxmemory", "0")
        assert client.exists(*keys) == 2
