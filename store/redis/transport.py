"""How the Redis store's commands reach Redis: hiredis packing, a direct path for apply, and
cancellations that are never lost on the way.

Imports neither zmq nor fastapi. Why (figures in bench/README.md, ingest_redis.py): one
batch's EVALSHA carries hundreds of arguments, and redis-py's asyncio `pack_command` is
Python that re-joins its buffer for every argument, where hiredis (already installed to
parse replies) packs them in C several times faster. redis-py's command layer (pool
checkout, retry wrapper, response callbacks, observability hooks) then costs more per call
than writing the packed bytes on a pooled connection, which is what `DirectScript` does for
a standalone server.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import sys
import types
from collections import deque
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar, cast

import hiredis
import redis.asyncio.connection
from redis._parsers.hiredis import NOT_ENOUGH_DATA, _AsyncHiredisParser
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ConnectionError,
    NoScriptError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)

from kvsi.store.redis.plan import Arg
from kvsi.store.redis.resp import (
    HEAD,
    pack_evalsha,
    pack_transaction,
    take_replies,
    transaction_reply,
)

C = TypeVar("C", bound=AbstractConnection)
T = TypeVar("T")

_PACKING: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def packing(base: type[C]) -> type[C]:
    """`base` (plain, TLS or unix-socket connection) with hiredis packing, connecting again
    before it writes if its transport was closed under it (a reset while idle); one per base.

    The store's client only sends str, bytes, int and float arguments, which both packers
    render alike (floats by repr); anything else falls back to redis-py's packer and errors.
    """
    if base in _PACKING.values():
        return base
    if base in _PACKING:
        return cast(type[C], _PACKING[base])

    class HiredisPacking(base):  # type: ignore[valid-type,misc]
        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            # A connection the server (or a middlebox) reset while it sat idle is connected
            # again first, as one never made: uvloop refuses a write to a closed transport
            # with a RuntimeError no retry takes, where asyncio's loop drops the write and
            # the read's ConnectionError is retried.
            writer = self._writer
            if writer is not None and writer.transport.is_closing():
                await self.disconnect(nowait=True)
            await super().send_packed_command(command, check_health)

        def pack_command(self, *args: Any) -> list[bytes]:
            if isinstance(args[0], str) and " " in args[0]:
                args = (*args[0].split(), *args[1:])  # "SCRIPT LOAD" is two words
            try:
                return [hiredis.pack_command(args)]
            except TypeError:
                return list(super().pack_command(*args))

    HiredisPacking.__name__ = HiredisPacking.__qualname__ = f"HiredisPacking{base.__name__}"
    _PACKING[base] = HiredisPacking
    return HiredisPacking


def use_hiredis_packing(client: Redis | RedisCluster) -> None:
    """Make the (not yet connected) client's connections pack with hiredis.

    Standalone: the pool's `connection_class`. Cluster: the connection kwargs every node is
    built from, and the startup nodes already built from them.
    """
    if isinstance(client, RedisCluster):
        kwargs = client.connection_kwargs
        kwargs["connection_class"] = packing(kwargs["connection_class"])
        for node in client.startup_nodes:
            node.connection_class = packing(node.connection_class)
    else:
        pool = client.connection_pool
        pool.connection_class = packing(pool.connection_class)


async def wait_for(aw: Awaitable[T], timeout: float | None) -> T:  # noqa: ASYNC109 (its signature)
    """`asyncio.wait_for` as Python 3.12 builds it: the await inside `asyncio.timeout`, so a
    cancellation of the caller always ends the call with CancelledError."""
    async with asyncio.timeout(timeout):
        return await aw


def keep_cancellations() -> None:
    """Give redis-py's connections (every client of the process) a `wait_for` that never
    swallows a cancellation, on Python 3.11.

    Python 3.11's `asyncio.wait_for` returns the result instead of raising CancelledError
    when the task is cancelled in the loop turn its operation completes (CPython issue
    gh-86296, fixed in 3.12), and redis-py sends every command through it when the
    connection has a socket timeout. A cancelled task then went on as if never cancelled:
    a stream told to stop kept running and its pool's `stop` waited for it forever
    (tests/store/test_redis_cancellation.py). Only redis-py's connection module is given
    the fixed function; the rest of the process keeps asyncio's own.
    """
    names = vars(redis.asyncio.connection)
    if sys.version_info < (3, 12) and not isinstance(names["asyncio"], _Asyncio):
        names["asyncio"] = _Asyncio()


class _Asyncio(types.ModuleType):
    """asyncio, but for `wait_for`."""

    def __init__(self) -> None:
        super().__init__(asyncio.__name__, asyncio.__doc__)
        self.__dict__.update(vars(asyncio))
        self.wait_for = wait_for


class DirectScript:
    """apply.lua calls on a standalone server: a write as a guarded transaction of plain
    commands (`resp.pack_transaction`), a call without ops as EVALSHA of `script`; packed
    here, auto-pipelined.

    Why a transaction: Redis spends more CPU on a script's command than on the same command
    sent plainly (each argument made a Lua string, then a Redis string again), and a write
    is hundreds of set members (bench/README.md, ingest_redis.py). The transaction is
    `WATCH vlog abort`, `EVAL guard.lua` (check.lua's checks; a refusal or an error sets the
    abort key, this call's own), `MULTI`, `EXISTS vlog abort`, the commands, `EXEC`: the
    writes run all at once, after the checks passed and before any other write of the
    worker's version, or not at all (`resp.transaction_reply`); an `EXEC` that ran nothing
    because a command could not be queued sends the call again as `script` (which writes,
    or says why not). The guard goes as EVAL, never EVALSHA:
    a NOSCRIPT would leave the writes unguarded.

    Does what redis-py's AsyncScript does (load the script again after NOSCRIPT) without the
    command layer. Calls from concurrent writers (one per worker: each worker's calls are
    serialized by its lock) share one connection, made by the client's pool with its
    options: the calls queued while the event loop runs the other tasks go out in one
    write, and one reader task hands the replies back in order: a fraction of the client
    CPU per call of a connection per call (each call one `send` and one `recv`, slow
    syscalls on a VM; bench/README.md). Each call is still one transaction (or EVALSHA),
    atomic on its own; pipelining only batches the bytes.

    Errors: an error reply fails its own call only. A connection error or timeout (the
    connection's `socket_timeout`, per reply) fails every call in flight on that
    connection, which is then dropped: whether those writes landed is unknown, so their
    writers drop their mirrors. A cancelled call's reply is still read (and discarded), so
    replies never shift. A cluster's calls go by `ClusterDirectScript`.
    """

    def __init__(self, client: Redis, script: AsyncScript, guard: str) -> None:
        self._client = client
        self._script = script
        self._transaction = Transaction(guard)
        self._pipe: _Pipe | None = None
        self._connecting: asyncio.Lock | None = None

    async def __call__(self, keys: list[str], args: list[Arg]) -> Any:
        if len(args) > HEAD:
            reply = await self._transaction(await self._connected(), keys, args)
            if reply is not None:
                return reply
        try:
            return await self._once(keys, args)
        except NoScriptError:
            self._script.sha = await self._client.script_load(self._script.script)
            return await self._once(keys, args)

    async def _once(self, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        packed = pack_evalsha(self._script.sha, keys, args)
        pipe = await self._connected()
        return await pipe.call(packed)

    async def _connected(self) -> _Pipe:
        pipe = self._pipe
        if pipe is None or pipe.dead:
            pipe = await self._connect()
        return pipe

    async def _connect(self) -> _Pipe:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            pipe = self._pipe
            if pipe is None or pipe.dead:
                conn = self._client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
                await conn.connect()
                pipe = self._pipe = _Pipe(conn)
            return pipe

    def flush(self) -> None:
        """Write the calls queued so far now, not at the end of this loop round: a caller
        about to plan its next call (CPU, no yield) lets Redis run this one meanwhile."""
        if self._pipe is not None:
            self._pipe.flush()

    async def aclose(self) -> None:
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            await pipe.close()


_REDIRECTED = (NoScriptError, AskError, TryAgainError, ClusterDownError)
"""Replies that say the script did not run on that node (MovedError is an AskError): the call
goes again through redis-py, which loads the script or follows the cluster."""


class ClusterDirectScript:
    """apply.lua calls on a Redis Cluster, sent straight to the node that serves its first
    key's slot, as `DirectScript` sends them (a write as a guarded transaction, a call
    without ops as EVALSHA of `script`) and auto-pipelined per node (one `_Pipe` each),
    instead of redis-py's cluster command layer and one socket write per call.

    Every key of one call is one worker's (one hash slot). What the direct path does not
    handle goes through redis-py's AsyncScript, which follows the cluster: a client whose
    slot map is not loaded yet, a slot no node covers, a reply saying the script did not run
    there (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, NOSCRIPT: safe to send again; a transaction
    whose EXEC ran nothing, as a MOVED while queuing makes it), and the first
    call to a node after its connection failed (redis-py then refreshes the slot map, so a
    failover is followed). A connection error or timeout fails the calls in flight on that
    node, as `DirectScript`'s do (whether they landed is unknown).
    """

    def __init__(self, client: RedisCluster, script: AsyncScript, guard: str) -> None:
        self._client = client
        self._script = script
        self._transaction = Transaction(guard)
        self._pipes: dict[str, _Pipe] = {}
        self._failed: set[str] = set()
        """Nodes whose connection failed: their next call goes through redis-py."""
        self._connecting: asyncio.Lock | None = None

    async def __call__(self, keys: list[str], args: list[Arg]) -> Any:
        client = self._client
        if client._initialize:  # the slot map is loaded by redis-py's first command
            return await self._script(keys=keys, args=args)
        try:
            node = client.nodes_manager.get_node_from_slot(client.keyslot(keys[0]))
        except SlotNotCoveredError:
            return await self._script(keys=keys, args=args)
        name = node.name
        if name in self._failed:
            self._failed.discard(name)
            return await self._script(keys=keys, args=args)
        pipe = self._pipes.get(name)
        try:
            if pipe is None or pipe.dead:
                pipe = await self._connect(node)
            if len(args) <= HEAD:
                return await pipe.call(pack_evalsha(self._script.sha, keys, args))
            reply = await self._transaction(pipe, keys, args)
            if reply is not None:
                return reply
            return await self._script(keys=keys, args=args)
        except _REDIRECTED:
            return await self._script(keys=keys, args=args)
        except (ConnectionError, TimeoutError, OSError):
            self._failed.add(name)
            raise

    async def _connect(self, node: ClusterNode) -> _Pipe:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            pipe = self._pipes.get(node.name)
            if pipe is None or pipe.dead:
                # As redis-py's ClusterNode makes its connections: no retry of its own.
                kwargs = node.connection_kwargs | {"retry": Retry(NoBackoff(), 0)}
                conn = node.connection_class(**kwargs)
                await conn.connect()  # type: ignore[no-untyped-call]
                pipe = self._pipes[node.name] = _Pipe(conn)
            return pipe

    def flush(self) -> None:
        """`DirectScript.flush`, on every node's connection."""
        for pipe in self._pipes.values():
            pipe.flush()

    async def aclose(self) -> None:
        pipes, self._pipes = list(self._pipes.values()), {}
        for pipe in pipes:
            await pipe.close()


class Transaction:
    """One write as a guarded transaction on a pipe (`resp.pack_transaction`): its reply, or
    None when the EXEC ran nothing because a command could not be queued or the guard
    failed (`resp.transaction_reply`), for the caller to send the call again as apply.lua
    its own way."""

    __slots__ = ("_abort_key", "_guard")

    def __init__(self, guard: str) -> None:
        self._guard = guard
        self._abort_key = AbortKeys()

    async def __call__(self, pipe: _Pipe, keys: list[str], args: list[Arg]) -> Any | None:
        packed, count = pack_transaction(self._guard, self._abort_key(keys), keys, args)
        return transaction_reply(await pipe.call(packed, count))


class AbortKeys:
    """The abort key of each transaction (guard.lua): after the worker's meta key, this
    transport's own random name and a count, so no call watches a key an earlier one set
    (whose expiry within the call's WATCH would abort it)."""

    __slots__ = ("_count", "_infix")

    def __init__(self) -> None:
        self._infix = f":abort:{secrets.token_hex(6)}:"
        self._count = itertools.count()

    def __call__(self, keys: list[str]) -> str:
        return f"{keys[0]}{self._infix}{next(self._count)}"


class _Pipe:
    """One connection of DirectScript: packed calls out in one write per loop round, replies
    back in order to the calls' futures: the reply, or for a call of several commands the
    list of their replies (an error reply as its exception, not raised)."""

    __slots__ = ("conn", "counts", "dead", "flushing", "loop", "out", "reader", "waiting")

    def __init__(self, conn: AbstractConnection) -> None:
        self.conn = conn
        self.loop = asyncio.get_running_loop()
        self.out: list[bytes] = []
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.counts: deque[int] = deque()
        self.flushing = False
        self.reader: asyncio.Task[None] | None = None
        self.dead = False

    def call(self, packed: bytes, replies: int = 1) -> asyncio.Future[Any]:
        """Send `packed`, the bytes of `replies` commands."""
        fut: asyncio.Future[Any] = self.loop.create_future()
        self.out.append(packed)
        self.waiting.append(fut)
        self.counts.append(replies)
        if not self.flushing:
            self.flushing = True
            self.loop.call_soon(self.flush)
        if self.reader is None:
            self.reader = self.loop.create_task(self._read())
        return fut

    def flush(self) -> None:
        """Write what was queued: runs once the tasks ready in this loop round have run, or
        at once when a caller has CPU work to do before it next yields (`DirectScript.flush`)."""
        self.flushing = False
        if self.dead or not self.out:
            return
        writer = self.conn._writer  # the connection's StreamWriter (redis-py keeps it there)
        data = self.out[0] if len(self.out) == 1 else b"".join(self.out)
        self.out.clear()
        try:
            if writer is None or writer.transport.is_closing():
                raise ConnectionError("connection closed")
            writer.write(data)  # buffered by the transport; never blocks
        except Exception as exc:
            self._fail(exc)

    async def _read(self) -> None:
        """Read while calls wait; the task ends when none does (the next call starts one)."""
        waiting = self.waiting
        try:
            while waiting:
                count = self.counts[0]
                reply = await self._reply() if count == 1 else await self._replies(count)
                fut = waiting.popleft()
                self.counts.popleft()
                if fut.done():  # cancelled meanwhile: its reply is read and dropped
                    continue
                if isinstance(reply, ResponseError):
                    fut.set_exception(reply)
                else:
                    fut.set_result(reply)
        except BaseException as exc:
            self._fail(exc)
            await self.conn.disconnect(nowait=True)
            if not isinstance(exc, Exception):
                raise
        finally:
            self.reader = None

    async def _reply(self) -> Any:
        try:
            return await self.conn.read_response(disconnect_on_error=False)
        except ResponseError as exc:  # an error reply: that call's own
            return exc

    async def _replies(self, count: int) -> list[Any]:
        """`count` replies: those already read taken straight from hiredis' reader (a
        transaction's hundreds of QUEUED), as `read_response` would take them (a push
        message handed to the parser, not counted; a connection error raised), the others
        read through the connection."""
        out = [await self._reply()]
        parser = self.conn._parser
        reader = parser._reader if isinstance(parser, _AsyncHiredisParser) else None
        push = None if reader is None else parser._hiredis_PushNotificationType
        apart = (ConnectionError,) if push is None else (ConnectionError, push)
        while len(out) < count:
            if reader is not None:
                left = take_replies(reader.gets, out, count, NOT_ENOUGH_DATA, apart)
                if left is None:
                    break
                if isinstance(left, ConnectionError):
                    raise left
                if left is not NOT_ENOUGH_DATA:
                    await parser.handle_push_response(left)
                    continue
            out.append(await self._reply())
        return out

    def _fail(self, exc: BaseException) -> None:
        """Every call in flight fails with `exc`; the connection is not used again."""
        self.dead = True
        self.out.clear()
        self.counts.clear()
        if isinstance(exc, asyncio.CancelledError):
            exc = ConnectionError("connection reader cancelled")
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_exception(exc)

    async def close(self) -> None:
        self._fail(ConnectionError("store closed"))
        if self.reader is not None:
            self.reader.cancel()
        await self.conn.disconnect()
