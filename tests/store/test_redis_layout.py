"""What the Redis store promises about its keys: one slot per worker, no SCAN, own prefix."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from redis.asyncio.connection import Connection
from redis.crc import key_slot

from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    WorkerCleared,
    WorkerKey,
    WorkerState,
    WorkerStatus,
)
from kvsi.store.redis import RedisStore
from kvsi.store.redis.layout import (
    Progress,
    decode_progress,
    decode_residency,
    encode_progress,
    encode_residency,
    states_key,
    states_log_key,
)
from kvsi.store.select import open_store
from tests.store.conftest import MakeStore

pytestmark = pytest.mark.redis

A = WorkerKey("pod-a", 0)
B = WorkerKey("pod-b", 3)
BIG = 2**64 - 59
DIGEST = bytes(range(32))


def _batches() -> list[Batch]:
    """A stream touching every kind of write: stores with and without session, removals,
    two parts, a clear, and session ids with braces (which must not move the hash tag)."""
    return [
        Batch(0, 1.0, [EntriesStored([1, 2, BIG], "GPU", 0, "s{1}"), EntriesStored([3], None)]),
        Batch(1, 2.0, [EntriesStored([2, DIGEST], "CPU", 1, "{s2}"), EntriesRemoved([1])]),
        Batch(2, 3.0, [WorkerCleared(), EntriesStored([4, 5], "GPU", 0, "s{1}")]),
        Batch(3, 4.0, [EntriesRemoved([4], "GPU", 0), EntriesStored([6], "GPU", 0, "s3")]),
    ]


async def _fill(store: RedisStore, *workers: WorkerKey) -> None:
    for worker in workers:
        for batch in _batches():
            await store.apply(worker, batch)


def _snapshot(raw: redis.Redis, pattern: str) -> dict[bytes, Any]:
    """Every key matching `pattern` with its serialized value (test side: KEYS is fine)."""
    return {key: raw.dump(key) for key in raw.keys(pattern)}


async def test_one_batch_writes_keys_of_one_cluster_slot(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await make_store()
    # As on a cluster: the directories' asserts go before the call, not in it (on a
    # standalone server they ride in it: tests/store/test_redis_directory.py).
    monkeypatch.setattr(store._directories, "_inline", False)
    seen: list[list[str]] = []
    call = store._apply_call

    async def recording(keys: list[str], args: list[Any]) -> Any:
        seen.append(list(keys))
        return await call(keys, args)

    store._apply_call = recording
    await _fill(store, B)
    await store.mark_unconfirmed(B)
    await store.drop_unconfirmed(B)
    await store.clear_worker(B)
    await store.remove_worker(B)
    assert len(seen) > len(_batches())
    for keys in seen:
        assert {key_slot(k.encode()) for k in keys} == {key_slot(b"{pod-b/3}")}


async def test_clearing_a_worker_touches_only_its_keys(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    store = await make_store()
    await _fill(store, A, B)
    before_b = _snapshot(raw, f"{prefix}:{{pod-b/3}}:*")
    await store.clear_worker(A)
    assert _snapshot(raw, f"{prefix}:{{pod-b/3}}:*") == before_b
    left = {k.decode().rpartition("}:")[2] for k in raw.keys(f"{prefix}:{{pod-a/0}}:*")}
    # fence, status, sessions ever seen, the change feed (a clear is no reset of it), and the
    # residencies, without blocks now, holding what the clear took as lost; the first blocks
    # asserted in the block directory (a superset, trimmed by the writer's upkeep)
    assert left == {"meta", "vlog", "parts", "seen", "feed", "res", "f"}
    await store.remove_worker(A)
    assert raw.keys(f"{prefix}:{{pod-a/0}}:*") == []
    assert _snapshot(raw, f"{prefix}:{{pod-b/3}}:*") == before_b
    assert raw.smembers(f"{prefix}:workers") == {b"pod-b/3"}


async def test_the_store_never_scans_the_keyspace(make_store: MakeStore, raw: redis.Redis) -> None:
    store = await make_store()
    reader = await make_store()
    raw.config_resetstat()
    await _fill(store, A, B)
    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 1.0))
    await store.mark_unconfirmed(A)
    await store.apply(A, Batch(9, 9.0, [EntriesStored([5], "GPU", 0, "s{1}")]))
    await store.drop_unconfirmed(A)
    for s in (store, reader):
        await s.list_workers()
        await s.list_sessions(pod=None, limit=1, cursor=None)
        await s.list_sessions(pod="pod-b", limit=1, cursor="3.0|s")
        await s.get_session("s3")
        await s.session_blocks("s3", pod=None, medium="GPU", limit=2, cursor=None)
        await s.worker_blocks("pod-a", dp_rank=None, medium=None, limit=2, cursor=None)
        await s.fence(A)
        await s.worker_models()
        await s.instances()
        await s.worker_losses()
    await store.expire_sessions(100.0, 1000)
    await store.clear_worker(B)
    await store.remove_worker(A)
    used = set(raw.info("commandstats"))
    assert used & {"cmdstat_keys", "cmdstat_scan"} == set()
    assert "cmdstat_evalsha" in used


async def test_a_flushed_script_is_loaded_again(server_url: str, prefix: str) -> None:
    store = RedisStore.from_url(f"{server_url}?prefix={prefix}")
    try:
        await store.apply(A, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))
        await store._client.script_flush()
        await store.apply(A, Batch(1, 2.0, [EntriesStored([2], "GPU", 0, "s")]))
        await store._client.script_flush()
        await store.apply(A, Batch(2, 3.0, [EntriesRemoved([1, 2])]))
        assert (await store.expire_sessions(10.0, 1000)).sessions == 1
        assert await store.get_session("s") is None
    finally:
        await store.close()


async def test_prefixes_keep_fleets_apart(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    one = await make_store(prefix=f"{prefix}-one")
    two = await make_store(prefix=f"{prefix}-two")
    await one.apply(A, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))
    await two.apply(A, Batch(7, 1.0, [EntriesStored([2, 3], "GPU", 0, "s")]))
    (w1,) = await one.list_workers()
    (w2,) = await two.list_workers()
    assert (w1.blocks, w1.last_seq, w2.blocks, w2.last_seq) == (1, 0, 2, 7)
    await one.remove_worker(A)
    gone = await one.get_session("s")
    assert gone is not None and gone.total_blocks == 0  # kept until it expires
    assert (await one.expire_sessions(2.0, 1000)).sessions == 1
    # Only the fleet's states counter and log are left: the removal moved them.
    left = set(raw.keys(f"*{prefix}-one*"))
    assert left == {states_key(f"{prefix}-one").encode(), states_log_key(f"{prefix}-one").encode()}
    view = await two.get_session("s")
    assert view is not None and view.total_blocks == 2
    assert all(k.startswith(f"{prefix}-two:".encode()) for k in raw.keys(f"{prefix}-t*"))


async def test_int_hashes_are_signed_members_of_an_intset(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    store = await make_store()
    await store.apply(A, Batch(0, 1.0, [EntriesStored([1, BIG, 2**63], "GPU", 0, "s")]))
    await store.apply(A, Batch(1, 2.0, [EntriesStored([DIGEST], "GPU", 1, "s")]))
    ints = f"{prefix}:{{pod-a/0}}:s:0:s"
    assert raw.object("encoding", ints) == b"intset"
    assert raw.smembers(ints) == {b"1", str(BIG - 2**64).encode(), str(-(2**63)).encode()}
    assert raw.smembers(f"{prefix}:{{pod-a/0}}:s:1:s") == {b"\x00" + DIGEST}
    page = await store.session_blocks("s", pod=None, medium=None, limit=10, cursor=None)
    assert page is not None and page.items == [1, 2**63, BIG, DIGEST]


def test_store_urls_select_the_backend_and_its_options() -> None:
    store = open_store("redis://127.0.0.1:1/2?prefix=blue&registry_ttl=0.5&socket_timeout=3")
    assert isinstance(store, RedisStore)
    assert (store._prefix, store._registry_ttl) == ("blue", 0.5)
    kwargs = store._client.connection_pool.connection_kwargs  # type: ignore[union-attr]
    assert (kwargs["db"], kwargs["socket_timeout"]) == (2, 3.0)
    assert isinstance(open_store("redis+cluster://127.0.0.1:1"), RedisStore)
    assert isinstance(open_store("rediss://127.0.0.1:1"), RedisStore)
    with pytest.raises(ValueError, match="must be non-empty and contain no"):
        RedisStore.from_url("redis://127.0.0.1:1?prefix=a{b}")
    with pytest.raises(ValueError, match="registry_ttl must be a number"):
        RedisStore.from_url("redis://127.0.0.1:1?registry_ttl=soon")
    with pytest.raises(ValueError, match="scheme must be one of redis, rediss"):
        RedisStore.from_url("valkey://127.0.0.1:1")


def test_connections_pack_with_hiredis_exactly_as_redis_py() -> None:
    standalone = RedisStore.from_url("redis://127.0.0.1:1")
    cluster = RedisStore.from_url("redis+cluster://127.0.0.1:1")
    conn_class = standalone._client.connection_pool.connection_class  # type: ignore[union-attr]
    kwargs = cluster._client.connection_kwargs  # type: ignore[union-attr]
    assert conn_class.__name__ == "HiredisPackingConnection"
    assert kwargs["connection_class"].__name__ == "HiredisPackingConnection"
    args = ("SCRIPT LOAD", "x", 0.1, 1e300, -0.0, 2**63 - 1, -(2**63), b"\x00\xff", "é{}")
    fast = conn_class().pack_command(*args)
    slow = Connection().pack_command(*args)
    assert b"".join(fast) == b"".join(slow)


@pytest.mark.parametrize(
    "progress",
    [
        Progress(2, 16, BIG, 7),
        Progress(0, None, DIGEST, None),
        Progress(3, 32, None, None),
        Progress(1, None, 5, 0),
        Progress(),
    ],
)
def test_residency_values_carry_what_eviction_took(progress: Progress) -> None:
    held = encode_residency(12.5, {0: 3, 2: 1}, encode_progress(*progress)).encode()
    assert decode_residency(held) == (12.5, {0: 3, 2: 1})
    assert decode_progress(held) == progress
    empty = encode_residency(12.5, {}, encode_progress(*progress)).encode()
    assert b" " not in empty, "expire.lua takes a value without a space for one without blocks"
    assert decode_residency(empty) == (12.5, {})
    assert decode_progress(empty) == progress


def test_residency_values_written_before_lost_blocks_read_as_nothing_lost() -> None:
    for old in (b"12.5 0:3 2:1", b"12.5"):
        assert decode_progress(old) == Progress(lost=0, block_size=None, frontier=None)
        assert decode_progress(old).position is None
    assert decode_residency(b"12.5 0:3 2:1") == (12.5, {0: 3, 2: 1})


async def test_a_stored_old_residency_value_is_read_and_loaded_as_nothing_lost(
    make_store: MakeStore, raw: redis.Redis, prefix: str
) -> None:
    writer = await make_store()
    await writer.apply(A, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s", block_size=16)]))
    raw.hset(f"{prefix}:{{pod-a/0}}:res", "s", "1.0 0:2")  # as written before these fields
    reader = await make_store()
    view = await reader.get_session("s")
    assert view is not None
    (w,) = view.workers
    assert (w.blocks, w.lost_blocks, w.reprefill_tokens, w.frontier) == (2, 0, None, None)
    # A writer whose mirror loads that value counts from there.
    later = await make_store()
    await later.apply(A, Batch(1, 2.0, [EntriesRemoved([1], "GPU", 0)]))
    view = await reader.get_session("s")
    assert view is not None
    (w,) = view.workers
    assert (w.blocks, w.lost_blocks, w.reprefill_tokens, w.frontier) == (1, 1, None, None)


async def test_requests_meeting_a_stale_cache_share_one_read_of_it(
    make_store: MakeStore, raw: Any
) -> None:
    """At 500 requests/s every request in flight when the worker-state cache went stale read
    all of it again: one EXISTS and one HGET per worker each. They now share one read (of
    the worker whose state changed: the states log names it)."""
    writer = await make_store()
    workers = [WorkerKey(f"pod-{i}", 0) for i in range(20)]
    for w in workers:
        await writer.apply(w, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))
    await writer.set_status(workers[1], WorkerStatus(state=WorkerState.LIVE, since=1.0))
    reader = await make_store(registry_ttl="0.05")
    await reader.worker_states()  # up to the states log's first entry
    await writer.set_status(workers[0], WorkerStatus(state=WorkerState.LIVE, since=2.0))
    await asyncio.sleep(0.06)  # both caches stale now, and a state changed
    raw.config_resetstat()
    answers = await asyncio.gather(*(reader.worker_states() for _ in range(30)))
    assert all(a == answers[0] for a in answers) and set(answers[0]) == set(workers)
    calls = {name: int(stats["calls"]) for name, stats in raw.info("commandstats").items()}
    assert calls["cmdstat_smembers"] == 1
    assert calls["cmdstat_hget"] == 1, "the one worker the states log names, read once"
