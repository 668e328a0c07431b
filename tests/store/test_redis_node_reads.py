"""The cluster reader's direct path (store/redis/node_reads.py): a lookup and a prefix match
answer alike while a slot moves (ASK, then MOVED), after every connection was killed, and
after calls cancelled at any point, by falling back to redis-py's cluster pipeline or by
dropping a connection whose replies were left unread."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.crc import key_slot

from kvsi.store.directory import block_key, hint_key
from kvsi.store.model import Batch, EntriesStored, SessionView, WorkerKey
from kvsi.store.redis import RedisStore
from kvsi.store.redis.layout import WorkerKeys, member
from kvsi.store.redis.node_reads import NodeReads
from tests.redis_servers import RedisClusterServers
from tests.store.conftest import MakeStore

pytestmark = pytest.mark.cluster

WORKERS = [WorkerKey(f"pod-{i}", 0) for i in range(6)]
PROMPT = [11, 12, 13]


def nodes_of(store: RedisStore) -> NodeReads:
    nodes = store._nodes
    assert nodes is not None, "a cluster's reader has the direct path"
    return nodes


async def filled(make_store: MakeStore, url: str) -> tuple[RedisStore, RedisStore]:
    """A writer and a reader; sessions `s-<i>` on worker i (and `s-0` on worker 1 too), the
    prompt PROMPT started on workers 0 and 2."""
    writer, reader = await make_store(url), await make_store(url)
    for i, w in enumerate(WORKERS):
        events = [EntriesStored([100 + i, 200 + i], "GPU", 0, f"s-{i}", None)]
        if i in (0, 2):
            events.append(EntriesStored(PROMPT, "GPU", 0, f"p-{i}", None))
        if i == 1:
            events.append(EntriesStored([300], "CPU", 0, "s-0", None))
        await writer.apply(w, Batch(0, 10.0 + i, events))
    return writer, reader


async def answers(store: RedisStore) -> tuple[list[SessionView | None], object]:
    views = [await store.get_session(f"s-{i}") for i in range(len(WORKERS))]
    return views, await store.match_prefix([*PROMPT, 99], None)


def node_of(cluster: RedisClusterServers, slot: int) -> tuple[redis.Redis, str]:
    """The node serving `slot` (a raw client on it) and its id."""
    for n in cluster.nodes:
        c = n.client()
        for start, end, *owner in c.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end and int(owner[0][1]) == n.port:
                return c, c.execute_command("CLUSTER", "MYID").decode()
        c.close()
    raise AssertionError(f"no node serves slot {slot}")


def move_keys(cluster: RedisClusterServers, key: str) -> tuple[int, redis.Redis, str]:
    """Start moving `key`'s slot to another node and migrate its keys there: the source then
    answers ASK for them. Returns the slot, the target and its id."""
    slot = key_slot(key.encode())
    source, source_id = node_of(cluster, slot)
    port = source.connection_pool.connection_kwargs["port"]
    target = next(n for n in cluster.nodes if n.port != port).client()
    target_id = target.execute_command("CLUSTER", "MYID").decode()
    target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    to = target.connection_pool.connection_kwargs["port"]
    while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        source.execute_command("MIGRATE", "127.0.0.1", to, "", 0, 5000, "KEYS", *keys)
    source.close()
    return slot, target, target_id


def finish_move(cluster: RedisClusterServers, slot: int, target_id: str) -> None:
    """Give the slot to the target on every node: the source now answers MOVED."""
    for n in cluster.nodes:
        with n.client() as c:
            c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)


async def test_the_direct_path_answers_as_the_pipeline(
    make_store: MakeStore, redis_cluster: RedisClusterServers
) -> None:
    _, reader = await filled(make_store, redis_cluster.url)
    await answers(reader)  # the client's first call initializes it; NOSCRIPT loads prefix.lua
    warm = nodes_of(reader).fallbacks.copy()
    direct = await answers(reader)
    assert nodes_of(reader).fallbacks == warm, "the common case never falls back"
    reader._nodes = None  # the client's own pipeline
    assert await answers(reader) == direct
    views, prefix = direct
    assert [v and v.total_blocks for v in views] == [3, 2, 2, 2, 2, 2]
    assert prefix == {WORKERS[0]: [("GPU",)] * 3, WORKERS[2]: [("GPU",)] * 3}


@pytest.mark.parametrize("what", ["session directory", "block directory", "worker"])
async def test_reads_answer_alike_while_a_slot_moves(
    make_store: MakeStore, redis_cluster: RedisClusterServers, prefix: str, what: str
) -> None:
    _, reader = await filled(make_store, redis_cluster.url)
    expected = await answers(reader)
    key = {
        "session directory": hint_key(prefix, "s-0"),
        "block directory": block_key(prefix, member(PROMPT[0])),
        "worker": WorkerKeys(prefix, WORKERS[0]).res,
    }[what]
    nodes = nodes_of(reader)

    slot, target, target_id = move_keys(redis_cluster, key)
    assert await answers(reader) == expected, "ASK: answered through the pipeline"
    assert nodes.fallbacks["AskError"] > 0, nodes.fallbacks
    finish_move(redis_cluster, slot, target_id)
    assert await answers(reader) == expected, "MOVED: answered through the pipeline"
    assert nodes.fallbacks["MovedError"] > 0, nodes.fallbacks
    moved = nodes.fallbacks.copy()
    assert await answers(reader) == expected
    assert nodes.fallbacks == moved, "the client's slot map updated: direct again"
    target.close()


async def test_reads_answer_alike_after_their_connections_were_killed(
    make_store: MakeStore, redis_cluster: RedisClusterServers
) -> None:
    _, reader = await filled(make_store, redis_cluster.url)
    expected = await answers(reader)
    for n in redis_cluster.nodes:
        with n.client() as c:
            c.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert await answers(reader) == expected
    assert nodes_of(reader).fallbacks["ConnectionError"] > 0, (
        "the dead connections failed: the pipeline answered"
    )


async def test_a_cancelled_read_never_shifts_the_replies(
    make_store: MakeStore, redis_cluster: RedisClusterServers
) -> None:
    """Cancelled after 0, 1, 2, ... loop turns: before its writes, between them, while
    reading. The next calls on the same connections get their own replies."""
    _, reader = await filled(make_store, redis_cluster.url)
    expected = await answers(reader)
    for turns in range(12):
        task = asyncio.create_task(reader.get_session("s-0"))
        prefix = asyncio.create_task(reader.match_prefix([*PROMPT, 99], None))
        for _ in range(turns):
            await asyncio.sleep(0)
        task.cancel()
        prefix.cancel()
        await asyncio.gather(task, prefix, return_exceptions=True)
        assert await answers(reader) == expected, f"cancelled after {turns} turns"
