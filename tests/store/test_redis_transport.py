"""The apply path's wire: removals (REMOVE1 for single members), the entry index the plan
writes per bucket (once per call), and DirectScript's auto-pipelining.

Every index test compares with the memory store through the read side (see
test_redis_writers.snapshot).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
import redis.exceptions
from redis.asyncio import RedisCluster

from kvsi.store.directory import block_key, hint_key
from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    ApplyOutcome,
    Batch,
    EntriesRemoved,
    EntriesStored,
    Hash,
    StoreEvent,
    WorkerCleared,
    WorkerKey,
)
from kvsi.store.redis import RedisStore
from kvsi.store.redis.layout import WorkerKeys, bucket, member, worker_member
from kvsi.store.redis.mirror import Mirror
from kvsi.store.redis.plan import DEL, REMOVE1, SADD, SREM, Plan
from kvsi.store.redis.transport import ClusterDirectScript, DirectScript, _Pipe
from tests.redis_servers import RedisClusterServers
from tests.store.conftest import MakeStore
from tests.store.snapshots import snapshot

pytestmark = pytest.mark.redis

WORKERS = [WorkerKey(f"pod-{i}", 0) for i in range(6)]


def test_removals_of_one_member_per_session_go_in_one_op() -> None:
    mirror = Mirror(WorkerKeys("p", WORKERS[0]), "", None, has_status=True)
    stored = Batch(0, 1.0, [EntriesStored([i, 100 + i], "GPU", 0, f"s{i}") for i in range(5)])
    mirror.apply(stored, ApplyOutcome.APPLIED, "v1", 0.0)
    plan = mirror.apply(
        Batch(1, 2.0, [EntriesRemoved([0, 1, 2, 102, 103])]), ApplyOutcome.APPLIED, "v2", 0.0
    )
    keys = WorkerKeys("p", WORKERS[0])
    assert plan.ops[:4] == [SREM, 2, "2", "102"]  # s2 loses both of its blocks
    assert plan.ops[4:9] == [REMOVE1, 3, "0", "1", "103"]  # s0, s1, s3 lose one each
    assert plan.keys[2:6] == [keys.session(0, f"s{i}") for i in (2, 0, 1, 3)]


def bucket_ops(plan: Plan, base: str) -> list[tuple[str, str, list[object]]]:
    """(code, key, members) of the plan's writes to the entry-index buckets under `base`, in
    order (every such op takes one key)."""
    return [(code, key, group) for _, code, key, group in placed_ops(plan, base)]


def placed_ops(plan: Plan, base: str) -> list[tuple[int, str, str, list[object]]]:
    """`bucket_ops` with each op's place in `plan.ops`, and the DELs (key: their first)."""
    out: list[tuple[int, str, str, list[object]]] = []
    ops, i, k = plan.ops, 0, 2
    while i < len(ops):
        code, count = str(ops[i]), int(ops[i + 1])
        taken = count if code in (DEL, REMOVE1, "u") else 1
        key = plan.keys[k]
        if code == DEL or (code in (SADD, SREM) and key.startswith(base)):
            out.append((i, code, key, list(ops[i + 2 : i + 2 + count]) if code != DEL else []))
        k += taken
        i += 2 if code in (DEL, "u") else 2 + count
    return out


def test_a_run_writes_each_bucket_once_with_the_last_change_of_each_member() -> None:
    """Sixteen batches in one call: each touched bucket gets one SREM and one SADD at most,
    after every other op, holding each member's last change (a block stored then evicted in
    the run is taken out, one evicted then stored again is put in); a clear writes what
    came before it first."""
    keys = WorkerKeys("p", WORKERS[0])
    mirror = Mirror(keys, "", None, has_status=True)
    mirror.apply(
        Batch(0, 0.5, [EntriesStored([5], "GPU", 0, "s0")]), ApplyOutcome.APPLIED, "v", 0.0
    )
    run = Plan(keys)  # the worker's index exists now: the run writes only what it changes
    for seq in range(16):
        stored = [EntriesStored([1000 * seq + j for j in range(4)], "GPU", 0, f"s{seq % 3}")]
        if seq == 8:  # evicted at seq 2: back in
            stored.append(EntriesStored([1001], "GPU", 0, "s9"))
        gone = [1000 * (seq - 1) + 1] if seq else []
        mirror.apply(
            Batch(seq, 1.0 + seq, [*stored, EntriesRemoved(gone)]),
            ApplyOutcome.APPLIED,
            f"v{seq}",
            0.0,
            last=seq == 15,
            into=run,
        )
    run.seal()
    written = bucket_ops(run, keys.entry_base(0))
    assert len({(code, key) for code, key, _ in written}) == len(written), "once each"
    assert {k for k in run.keys[-len(written) :]} == {key for _, key, _ in written}, "last"
    final: dict[object, bool] = {}
    for code, key, group in written:
        assert all(key == f"{keys.entry_base(0)}{bucket(int(str(m)))}" for m in group)
        final.update(dict.fromkeys(group, code == SADD))
    assert final["2001"] is False and final["2000"] is True and final["15003"] is True
    assert final["1001"] is True
    assert sum(final.values()) == 16 * 4 - 14

    cleared = Plan(keys)
    mirror.apply(
        Batch(16, 20.0, [EntriesStored([77], "GPU", 0, "s1")]),
        ApplyOutcome.APPLIED,
        "v16",
        0.0,
        into=cleared,
    )
    mirror.apply(
        Batch(17, 21.0, [WorkerCleared(), EntriesStored([78], "GPU", 0, "s1")]),
        ApplyOutcome.APPLIED,
        "v17",
        0.0,
        into=cleared,
    )
    cleared.seal()
    placed = [(code, group) for _, code, _, group in placed_ops(cleared, keys.entry_base(0))]
    assert placed == [(SADD, ["77"]), (DEL, []), (SADD, ["78"])], "77's bucket before the clear"


async def test_a_clear_late_in_a_call_leaves_only_what_was_stored_after_it(
    make_store: MakeStore, raw: Any, prefix: str
) -> None:
    """A call of two batches, the second clearing the worker: the blocks the first stored
    are gone from the entry index (their buckets written before the DEL, not after)."""
    store = await make_store()
    await store.apply(WORKERS[0], Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s0")]))
    run = [
        Batch(1, 2.0, [EntriesStored([5, 2**64 - 3], "GPU", 0, "s1")]),
        Batch(2, 3.0, [WorkerCleared(), EntriesStored([6], "GPU", 0, "s1")]),
    ]
    await store.apply_many(WORKERS[0], run)
    keys = WorkerKeys(prefix, WORKERS[0])
    assert set().union(*(raw.smembers(key) for key in keys.entries(0))) == {b"6"}


async def test_a_run_leaves_the_entry_index_as_its_batches_one_by_one(
    make_store: MakeStore, raw: Any, prefix: str
) -> None:
    """Members stored, evicted and stored again within one call (a u64 past the i64 range, a
    digest among them) end in the buckets exactly as the same batches applied one at a
    time leave them, and the buckets hold exactly the worker's blocks."""
    digest = b"\x01" * 32
    batches = [
        Batch(0, 1.0, [EntriesStored([5, 133, 2**64 - 3, digest], "GPU", 0, "s0")]),
        Batch(1, 2.0, [EntriesRemoved([5, digest])]),
        Batch(2, 3.0, [EntriesStored([5, digest], "GPU", 0, "s1")]),
        Batch(3, 4.0, [EntriesRemoved([133, 2**64 - 3])]),
        Batch(4, 5.0, [EntriesStored([2**64 - 3, 261], "GPU", 0, "s2")]),
        Batch(5, 6.0, [EntriesRemoved([261])]),
    ]
    together = await make_store()
    await together.apply(WORKERS[0], Batch(0, 0.5, [EntriesStored([9], "GPU", 0, "s9")]))
    await together.apply_many(WORKERS[0], [Batch(b.seq + 1, b.ts, b.events) for b in batches])
    one_by_one = await make_store(prefix=f"{prefix}-apart")
    await one_by_one.apply(WORKERS[0], Batch(0, 0.5, [EntriesStored([9], "GPU", 0, "s9")]))
    for b in batches:
        await one_by_one.apply(WORKERS[0], Batch(b.seq + 1, b.ts, b.events))
    run = [raw.smembers(key) for key in WorkerKeys(prefix, WORKERS[0]).entries(0)]
    apart = [raw.smembers(key) for key in WorkerKeys(f"{prefix}-apart", WORKERS[0]).entries(0)]
    assert run == apart
    held = {member(h) for h in (9, 5, digest, 2**64 - 3)}
    assert set().union(*run) == {m if isinstance(m, bytes) else str(m).encode() for m in held}


EDGES: list[Hash] = [
    0, 1, 127, 128, 129, 9_999_999, 10_000_000, 10_000_127, 2**53 + 1, 2**63 - 1, 2**63,
    2**63 + 1, 2**64 - 1, 2**64 - 128, 2**64 - 129, 2**64 - 10_000_000, 2**64 - 12_345_678,
    b"", b"\x00", b"\x7f", b"\x80", b"\xff" * 32, bytes(range(16)),
]  # fmt: skip
"""Hashes around the edges of the buckets' arithmetic (the old apply.lua's: 7-digit tails; a
member's: the i64 sign, digests)."""


async def test_the_entry_index_is_bucketed_as_readers_look(
    make_store: MakeStore, raw: Any, prefix: str
) -> None:
    """The plan buckets each member (a u64 as a signed i64, a digest behind its mark);
    readers bucket the hash (`bucket`): the two must agree for every hash, or prefix matches
    miss blocks the worker holds."""
    store = await make_store()
    rng = random.Random(5)
    hashes = [*EDGES, *(rng.getrandbits(64) for _ in range(300))]
    stored = [EntriesStored(hashes[i : i + 7], "GPU", 0, f"s{i % 5}") for i in range(0, 330, 7)]
    await store.apply(WORKERS[0], Batch(0, 1.0, stored))
    keys = WorkerKeys(prefix, WORKERS[0])
    expected: dict[int, set[bytes]] = {}
    for h in hashes:
        m = member(h)
        expected.setdefault(bucket(h), set()).add(m if isinstance(m, bytes) else str(m).encode())
    for b, key in enumerate(keys.entries(0)):
        assert raw.smembers(key) == expected.get(b, set()), b
    gone = hashes[::3]
    await store.apply(WORKERS[0], Batch(1, 2.0, [EntriesRemoved(gone)]))
    assert sum(raw.scard(key) for key in keys.entries(0)) == len(set(hashes) - set(gone))


async def test_removals_take_their_members_out_of_the_entry_index(
    make_store: MakeStore, raw: Any, prefix: str
) -> None:
    """Every removal takes its members out of the index: sessions losing one block each
    (REMOVE1, one of them a block two sessions hold), a session losing several and blocks
    of no session."""
    store = await make_store()
    stored = [EntriesStored([10 * i + j for j in range(4)], "GPU", 0, f"s{i}") for i in range(4)]
    stored += [EntriesStored([30], "GPU", 0, "s4"), EntriesStored([100, 101], "GPU", 0, None)]
    await store.apply(WORKERS[0], Batch(0, 1.0, stored))
    gone = [0, 10, 30, 20, 21, 22, 100]
    await store.apply(WORKERS[0], Batch(1, 2.0, [EntriesRemoved(gone)]))
    keys = WorkerKeys(prefix, WORKERS[0])
    held = {str(e.block_hashes[j]).encode() for e in stored for j in range(len(e.block_hashes))}
    held -= {str(h).encode() for h in gone}
    assert set().union(*(raw.smembers(key) for key in keys.entries(0))) == held


async def test_mixed_batches_match_the_memory_store(make_store: MakeStore) -> None:
    """Ops replay in event order: store, remove, store again, clear mid-batch, orphans."""
    store, reader = await make_store(), await make_store()
    ref = MemoryStore()
    big = 2**64 - 5  # a u64 above i64: sent as a negative member
    batches = [
        Batch(0, 1.0, [EntriesStored([1, 2, big], "GPU", 0, f"s{i}") for i in range(3)]),
        Batch(
            1,
            2.0,
            [
                EntriesStored([7, 8], "GPU", 0, None),
                EntriesRemoved([1, big]),
                EntriesStored([1, 7], "GPU", 0, "s9"),
                EntriesRemoved([2, 7]),
                EntriesStored([2], "CPU", 0, "s0"),
            ],
        ),
        Batch(2, 3.0, [EntriesStored([5], "GPU", 0, "s1"), WorkerCleared(), EntriesStored([6])]),
        Batch(3, 4.0, [EntriesStored([6, 9], "GPU", 0, "s2"), EntriesRemoved([9, 6])]),
    ]
    for batch in batches:
        assert await store.apply(WORKERS[0], batch) == await ref.apply(WORKERS[0], batch)
        assert await snapshot(reader) == await snapshot(ref)


async def test_concurrent_workers_share_one_pipelined_connection(make_store: MakeStore) -> None:
    store, reader = await make_store(), await make_store()
    ref = MemoryStore()

    async def stream(w: WorkerKey) -> None:
        for seq in range(30):
            batch = Batch(
                seq,
                float(seq + 1),
                [
                    EntriesStored([seq * 10 + 1, seq * 10 + 2], "GPU", 0, f"{w.pod}-s{seq % 4}"),
                    EntriesRemoved([(seq - 3) * 10 + 1]),
                ],
            )
            assert await store.apply(w, batch) == await ref.apply(w, batch)

    await asyncio.gather(*(stream(w) for w in WORKERS))
    direct = store._direct
    assert direct is not None
    assert direct._pipe is not None and not direct._pipe.dead
    assert await snapshot(reader) == await snapshot(ref)


async def test_an_error_reply_fails_only_its_own_call(make_store: MakeStore) -> None:
    store = await make_store()
    direct = store._direct
    assert direct is not None
    meta = store.worker_keys(WORKERS[0]).meta
    await store._client.set(meta, "not a hash")  # HMGET on it: WRONGTYPE, for that call only
    good = [store.worker_keys(w).meta for w in WORKERS[1:3]]
    args = ["op", "", "", "", "applied", ""]
    out = await asyncio.gather(
        direct([good[0], good[0] + "x"], args),
        direct([meta, meta + "x"], args),
        direct([good[1], good[1] + "x"], args),
        return_exceptions=True,
    )
    assert isinstance(out[1], redis.exceptions.ResponseError)
    assert [r[0] for r in (out[0], out[2]) if not isinstance(r, BaseException)] == [
        b"applied",
        b"applied",
    ]
    assert await direct([good[0], good[0] + "x"], args)  # the connection carries on


async def test_a_cancelled_call_does_not_shift_the_replies(make_store: MakeStore) -> None:
    store = await make_store()
    direct = store._direct
    assert direct is not None
    keys = [[store.worker_keys(w).meta, store.worker_keys(w).vlog] for w in WORKERS]
    args = ["op", "", "", "", "applied", ""]
    slow = asyncio.ensure_future(direct(keys[0], args))
    fast = asyncio.ensure_future(direct(keys[1], args))
    await asyncio.sleep(0)
    slow.cancel()
    assert (await fast)[0] == b"applied"
    for k in keys[2:]:
        assert (await direct(k, args))[0] == b"applied"


async def test_a_dropped_connection_fails_every_call_in_flight(make_store: MakeStore) -> None:
    """Writers of every worker whose call was in flight drop their mirrors; the next batches
    reconnect, and the index ends as the memory store's."""
    store, reader = await make_store(), await make_store()
    ref = MemoryStore()
    first = [Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s")]) for _ in WORKERS]
    second = Batch(1, 2.0, [EntriesStored([3], "GPU", 0, "s"), EntriesRemoved([1])])
    for w, b in zip(WORKERS, first, strict=True):
        await store.apply(w, b)
        await ref.apply(w, b)
        await ref.apply(w, second)
    direct = store._direct
    assert direct is not None
    pipe = direct._pipe
    assert pipe is not None
    await _apply_through_a_drop(store, [pipe], second)
    assert await snapshot(reader) == await snapshot(ref)


async def _apply_through_a_drop(store: RedisStore, pipes: list[_Pipe], batch: Batch) -> None:
    """Every worker applies `batch` while `pipes`' connections drop: the calls that fail
    raise ConnectionError and drop their worker's mirror, and applying again succeeds."""

    def kill() -> None:
        for pipe in pipes:
            writer = pipe.conn._writer
            assert writer is not None
            writer.transport.abort()

    asyncio.get_running_loop().call_soon(kill)
    out = await asyncio.gather(*(store.apply(w, batch) for w in WORKERS), return_exceptions=True)
    failed = [w for w, r in zip(WORKERS, out, strict=True) if isinstance(r, BaseException)]
    assert failed
    for w, r in zip(WORKERS, out, strict=True):
        if isinstance(r, BaseException):
            assert isinstance(r, redis.exceptions.ConnectionError)
            assert store._writers[w].mirror is None
            assert await store.apply(w, batch) in (ApplyOutcome.APPLIED, ApplyOutcome.DUPLICATE)


async def test_closing_fails_calls_in_flight(make_store: MakeStore) -> None:
    store = await make_store()
    direct = store._direct
    assert isinstance(direct, DirectScript)
    keys = [store.worker_keys(WORKERS[0]).meta, store.worker_keys(WORKERS[0]).vlog]
    await direct(keys, ["op", "", "", "", "applied", ""])  # connected
    call = asyncio.ensure_future(direct(keys, ["op", "", "", "", "applied", ""]))
    await asyncio.sleep(0)
    await direct.aclose()
    with pytest.raises(redis.exceptions.ConnectionError):
        await call


# -- a cluster: ClusterDirectScript --------------------------------------------------------


@pytest.fixture
async def cluster_stores(
    make_store: MakeStore, redis_cluster: RedisClusterServers
) -> tuple[RedisStore, RedisStore]:
    """A writer and a reader on the cluster, sharing one index."""
    return await make_store(redis_cluster.url), await make_store(redis_cluster.url)


async def _stream_into(store: RedisStore, ref: MemoryStore, seqs: range) -> None:
    async def stream(w: WorkerKey) -> None:
        for seq in seqs:
            events: list[StoreEvent] = [
                EntriesStored([seq * 10 + 1, seq * 10 + 2], "GPU", 0, f"{w.pod}-s{seq % 4}")
            ]
            if seq >= 3:
                events.append(EntriesRemoved([(seq - 3) * 10 + 1]))
            batch = Batch(seq, float(seq + 1), events)
            assert await store.apply(w, batch) == await ref.apply(w, batch)

    await asyncio.gather(*(stream(w) for w in WORKERS))


async def _streamed_direct(
    store: RedisStore, seqs: range
) -> tuple[MemoryStore, ClusterDirectScript]:
    """The reference after `seqs` streamed into both, and the store's cluster direct path."""
    ref = MemoryStore()
    await _stream_into(store, ref, seqs)
    direct = store._direct
    assert isinstance(direct, ClusterDirectScript)
    return ref, direct


@pytest.mark.cluster
async def test_on_a_cluster_calls_go_straight_to_the_slots_node_auto_pipelined(
    cluster_stores: tuple[RedisStore, RedisStore],
) -> None:
    store, reader = cluster_stores
    ref, direct = await _streamed_direct(store, range(12))
    client = store._client
    assert isinstance(client, RedisCluster)
    nodes = {
        client.nodes_manager.get_node_from_slot(client.keyslot(store.worker_keys(w).meta)).name
        for w in WORKERS
    }
    assert set(direct._pipes) == nodes  # one connection per node the workers live on
    assert await snapshot(reader) == await snapshot(ref)


@pytest.mark.cluster
async def test_on_a_cluster_a_call_the_node_refuses_goes_again_through_redis_py(
    cluster_stores: tuple[RedisStore, RedisStore],
    redis_cluster: RedisClusterServers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stale slot map (the node answers MOVED) and a node without the script (NOSCRIPT):
    the script did not run there, so the call goes again through redis-py, which follows the
    cluster; the index ends as the memory store's."""
    store, reader = cluster_stores
    ref = MemoryStore()
    await _stream_into(store, ref, range(4))
    client = store._client
    assert isinstance(client, RedisCluster)
    manager = client.nodes_manager
    nodes = list(manager.nodes_cache.values())
    for w in WORKERS:  # a stale slot map: each worker's slot on another node
        slot = client.keyslot(store.worker_keys(w).meta)
        right = manager.slots_cache[slot][0]
        manager.slots_cache[slot] = [next(n for n in nodes if n.name != right.name)]
    await _stream_into(store, ref, range(4, 8))  # MOVED, then redis-py follows (and learns)
    for w in WORKERS:
        slot = client.keyslot(store.worker_keys(w).meta)
        with redis_cluster.nodes[0].client() as c:
            owner = next(
                f"{host}:{port}"
                for start, end, (host, port, *_), *_ in c.cluster("SLOTS")
                if start <= slot <= end
            )
        assert manager.slots_cache[slot][0].name.endswith(owner.split(":")[1])
    for node in redis_cluster.nodes:
        with node.client() as c:
            c.script_flush()
    await _stream_into(store, ref, range(8, 12))  # NOSCRIPT, then redis-py loads it
    assert await snapshot(reader) == await snapshot(ref)


@pytest.mark.cluster
async def test_on_a_cluster_a_dropped_connection_fails_its_calls_then_heals(
    cluster_stores: tuple[RedisStore, RedisStore],
) -> None:
    store, reader = cluster_stores
    ref, direct = await _streamed_direct(store, range(4))
    pipes = list(direct._pipes.values())
    second = Batch(4, 5.0, [EntriesStored([41], "GPU", 0, "s"), EntriesRemoved([11])])
    for w in WORKERS:
        await ref.apply(w, second)
    await _apply_through_a_drop(store, pipes, second)
    await _stream_into(store, ref, range(5, 8))  # direct again, on new connections
    assert all(not p.dead for p in direct._pipes.values())
    assert await snapshot(reader) == await snapshot(ref)


# -- a cluster: the directory asserts ------------------------------------------------------


def _spy_pipelines(store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the redis-py pipelines the store opens from now on (one item each)."""
    opened: list[int] = []
    make = store._pipeline

    def counted() -> Any:
        opened.append(1)
        return make()

    monkeypatch.setattr(store, "_pipeline", counted)
    return opened


async def _hinted(reader: RedisStore) -> dict[str, set[str]]:
    """The directory set of each session `_stream_into` stores, as the members it holds
    (each set with a TTL)."""
    out: dict[str, set[str]] = {}
    for sid in {f"{w.pod}-s{n}" for w in WORKERS for n in range(4)}:
        key = hint_key(reader._prefix, sid)
        raw = await reader._client.zrange(key, 0, -1)
        out[sid] = {m.decode() for m in raw}
        assert await reader._client.ttl(key) > 0, f"{key} without its EXPIRE"
    return out


async def _firsts_hinted(store: RedisStore, reader: RedisStore, seqs: range) -> None:
    """Each worker's first blocks of `seqs` (`_stream_into` stores seq * 10 + 1 first) are
    in its `firsts` set and their block sets name it, each set with a TTL."""
    client = reader._client
    for w in WORKERS:
        marked = {member(seq * 10 + 1) for seq in seqs}
        held = {int(m) for m in await client.smembers(store.worker_keys(w).firsts)}
        assert marked <= held, f"{w}: first blocks missing from its firsts set"
        for m in marked:
            key = block_key(reader._prefix, m)
            assert worker_member(w).encode() in await client.zrange(key, 0, -1), key
            assert await client.ttl(key) > 0, f"{key} without its EXPIRE"


_HINTED = {f"{w.pod}-s{n}": {worker_member(w)} for w in WORKERS for n in range(4)}
"""What `_stream_into` asserts: each worker in the sets of its four sessions."""


@pytest.mark.cluster
async def test_on_a_cluster_the_directory_asserts_go_one_round_trip_per_node(
    cluster_stores: tuple[RedisStore, RedisStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not through redis-py's ClusterPipeline: NodeReads' path, one write per node."""
    store, reader = cluster_stores
    ref = MemoryStore()
    await _stream_into(store, ref, range(2))  # the writers loaded, the client initialized
    nodes = store._nodes
    assert nodes is not None
    warm = nodes.fallbacks.copy()  # "unready" if an assert came before the client's first call
    opened = _spy_pipelines(store, monkeypatch)
    await _stream_into(store, ref, range(2, 8))  # new sessions and first blocks each batch
    assert opened == []
    assert nodes.fallbacks == warm
    assert await _hinted(reader) == _HINTED
    await _firsts_hinted(store, reader, range(2, 8))
    assert await snapshot(reader) == await snapshot(ref)


@pytest.mark.cluster
@pytest.mark.parametrize("stale", ["every node", "one node"])
async def test_on_a_cluster_asserts_a_node_refuses_go_again_through_redis_py(
    cluster_stores: tuple[RedisStore, RedisStore], monkeypatch: pytest.MonkeyPatch, stale: str
) -> None:
    """A stale slot map (for every node's slots, or for one node's while the others' asserts
    land): a node answers MOVED, the asserts go again through a redis-py pipeline (it
    follows the cluster); nothing is lost."""
    store, reader = cluster_stores
    ref = MemoryStore()
    await _stream_into(store, ref, range(2))
    opened = _spy_pipelines(store, monkeypatch)
    client = store._client
    assert isinstance(client, RedisCluster)
    manager = client.nodes_manager
    nodes = list(manager.nodes_cache.values())
    for slot, held in list(manager.slots_cache.items()):
        if stale == "every node" or held[0].name == nodes[0].name:
            manager.slots_cache[slot] = [next(n for n in nodes if n.name != held[0].name)]
    await _stream_into(store, ref, range(2, 6))
    assert opened
    assert await _hinted(reader) == _HINTED
    await _firsts_hinted(store, reader, range(2, 6))
    assert await snapshot(reader) == await snapshot(ref)
