"""The read side's commands (and the writers' directory asserts) on a Redis Cluster without
redis-py's cluster pipeline, for the common case; the pipeline for everything else.

Imports neither zmq nor fastapi. Why (bench/README.md, fleet_latency.py): the session
lookup and the prefix match are two rounds of a few commands each, and redis-py's
ClusterPipeline spends more client CPU on them than the commands themselves (a command
policy, slot and node resolution per command, a task per node, a timeout per reply): a
`get_session` cost several times its standalone figure.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from redis.asyncio import RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import Connection
from redis.crc import key_slot
from redis.exceptions import ResponseError

from kvsi.store.redis.cluster_client import WaitingCluster
from kvsi.store.redis.plan import Arg

Command = tuple[str, tuple[Arg, ...], dict[str, Any]]
"""A read (or a directory assert): the key it is routed by, its arguments, and the options
redis-py's reply callback for it takes (e.g. ZRANGE's `withscores`), as
`pipeline.execute_command` gets them."""

WITH_SCORES: dict[str, Any] = {"withscores": True, "score_cast_func": float}
"""The options `zrange(..., withscores=True)` passes to ZRANGE's reply callback."""


class NodeReads:
    """Commands grouped by the node the client's slot map names for their key, written on one
    connection of that node's own pool each (all written before any reply is read), then
    read back in order: one write and one read per node, no task, one timeout for the lot.

    Only the common case: the primaries, a slot map the client has, and every reply a
    value. Anything else answers None and the caller runs the same commands through the
    client's ClusterPipeline, which handles it as redis-py does: an error reply (a MOVED or
    ASK after a slot moved, TRYAGAIN, CLUSTERDOWN, NOSCRIPT, a wrong type), a connection
    that fails or times out (a node down, a connection killed), no connection left in a
    node's pool, a client reading from replicas or not initialized yet. Every command here
    is a read, a conditional prune (unhint.lua) or a writer's directory assert (ZADD of its
    worker at its time, EXPIRE, SADD), so running one again is harmless.

    A connection whose replies were not all read (an error, a timeout, a cancelled call)
    is disconnected before it goes back to its pool (redis-py reconnects it on next use),
    so replies never shift; replies are parsed and their callbacks applied as the node's
    own `parse_response` does, so both paths answer alike.

    On a `WaitingCluster` a round holds one of its places while it holds the nodes'
    connections; no place within the client's wait raises ConnectionError (the pipeline
    would wait as long again).
    """

    def __init__(self, client: RedisCluster) -> None:
        self._client = client
        self._waiting = client if isinstance(client, WaitingCluster) else None
        """The client, if its calls hold places: a round takes one while it holds the
        nodes' connections."""
        self._encode = client.encoder.encode
        self.fallbacks: Counter[str] = Counter()
        """Calls this path left to the client, by why: "unready" (client not initialized,
        reading from replicas or balancing its reads), "no slot", or the class of the error
        reply (redis-py's: MovedError, AskError, TryAgainError, ...) or of the exception
        (tests and profiles read it)."""

    def same_node(self, a: str, b: str) -> bool:
        """Whether the client's slot map names one node for both keys (False without one)."""
        slots = self._client.nodes_manager.slots_cache
        try:
            first = slots[key_slot(self._encode(a))][0]  # type: ignore[no-untyped-call]
            return bool(first.name == slots[key_slot(self._encode(b))][0].name)  # type: ignore[no-untyped-call]
        except (KeyError, IndexError):
            return False

    async def run(self, commands: Sequence[Command]) -> list[Any] | None:
        """The replies of `commands` in order, or None when the client must run them."""
        client = self._client
        if client._initialize or client.read_from_replicas or client.load_balancing_strategy:
            self.fallbacks["unready"] += 1
            return None
        slots = client.nodes_manager.slots_cache
        groups: dict[str, tuple[ClusterNode, list[int]]] = {}
        try:
            for i, (key, _, _) in enumerate(commands):
                node = slots[key_slot(self._encode(key))][0]  # type: ignore[no-untyped-call]
                group = groups.get(node.name)
                if group is None:
                    groups[node.name] = (node, [i])
                else:
                    group[1].append(i)
        except (KeyError, IndexError):  # a slot the map lacks
            self.fallbacks["no slot"] += 1
            return None
        held: list[tuple[ClusterNode, Connection, list[int]]] = []
        read = 0
        """Connections in `held` whose replies were all read."""
        waiting = self._waiting
        if waiting is not None:
            await waiting.take_place()
        try:
            out, refused = await self._exchange(commands, groups, held)
            read = len(held)
        except Exception as e:
            self.fallbacks[type(e).__name__] += 1
            return None
        finally:
            try:
                for _, conn, _ in held[read:]:
                    await conn.disconnect(nowait=True)  # replies left unread
                for node, conn, _ in held:
                    node.release(conn)
            finally:
                if waiting is not None:
                    waiting.give_place()
        if refused:
            self.fallbacks[refused] += 1
            return None
        return out

    async def _exchange(
        self,
        commands: Sequence[Command],
        groups: dict[str, tuple[ClusterNode, list[int]]],
        held: list[tuple[ClusterNode, Connection, list[int]]],
    ) -> tuple[list[Any], str]:
        """Write each node's commands, then read every reply (all of them, even after an
        error reply): the replies, and the first error reply's class ("" if none).
        `held` gets each connection as it is taken."""
        timeout = None
        for node, indexes in groups.values():
            conn = node.acquire_connection()
            held.append((node, conn, indexes))
            if conn.should_reconnect():  # type: ignore[no-untyped-call]
                await conn.disconnect()
            if not conn.is_connected:
                await conn.connect()  # type: ignore[no-untyped-call]
            timeout = conn.socket_timeout
            writer = conn._writer
            assert writer is not None
            writer.write(b"".join(conn.pack_commands([commands[i][1] for i in indexes])))
        out: list[Any] = [None] * len(commands)
        refused = ""
        async with asyncio.timeout(timeout):
            for node, conn, indexes in held:
                callbacks = node.response_callbacks
                for i in indexes:
                    try:
                        reply = await conn.read_response(timeout=math.inf)
                    except ResponseError as e:
                        refused = refused or type(e).__name__
                        continue
                    _, args, options = commands[i]
                    name = args[0]
                    if name in callbacks:
                        reply = callbacks[name](reply, **options)
                    out[i] = reply
        return out, refused
