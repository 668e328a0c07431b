"""The shared index store on Redis or Redis Cluster: fenced atomic writes, reads from Redis.

Imports neither zmq nor fastapi. Key layout, choices and their measurements: store/README.md.

Writes: per worker, a Mirror (store/redis/mirror.py) turns each batch into plain writes that
land in one guarded transaction (store/redis/transport.py) after guard.lua checked the fence
and the mirror's version, or in one EVALSHA of apply.lua, which checks the same.
Reads (store/redis/reads.py) never use a mirror. Every Redis error propagates: the API
answers 503, ingest buffers and retries.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import msgspec
import structlog
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError

from kvsi.store.base import ConnectionWaits
from kvsi.store.feed import FeedRecord, WorkerChange
from kvsi.store.model import (
    CLEARED,
    ApplyOutcome,
    Batch,
    Expired,
    Fence,
    IndexLostError,
    WorkerKey,
    WorkerStatus,
    advance,
    decide,
)
from kvsi.store.redis.cluster_client import WaitingCluster
from kvsi.store.redis.directories import Asserted, Directories, Due
from kvsi.store.redis.instances import RedisInstances
from kvsi.store.redis.layout import (
    DEFAULT_PREFIX,
    WorkerKeys,
    decode_part,
    decode_progress,
    decode_residency,
    hash_of,
    parse_edge,
    residency_time,
    worker_member,
)
from kvsi.store.redis.mirror import FEED_LENGTH, Mirror, batch_id
from kvsi.store.redis.node_reads import Command
from kvsi.store.redis.plan import MAX_ARGS, Arg, Plan
from kvsi.store.redis.pool import CountingPool
from kvsi.store.redis.reads import (
    STATES_LOG_LENGTH,
    Client,
    RedisReader,
    Seen,
    fence_of,
    lua,
    write_script,
)
from kvsi.store.redis.transport import (
    ClusterDirectScript,
    DirectScript,
    keep_cancellations,
    use_hiredis_packing,
)

SCHEMES = {
    "redis": "redis",
    "rediss": "rediss",
    "redis+cluster": "redis",
    "rediss+cluster": "rediss",
}
"""Store URL scheme -> the scheme redis-py is given; `+cluster` selects RedisCluster."""

CALL_MAX = 16
"""Most batches written in one apply.lua call: Redis runs a call's script in one go while its
other clients wait, and the bound keeps that wait short. A longer run goes as several calls,
each planned while Redis runs the one before (`RedisStore._apply_calls`)."""

WRITE_ATTEMPTS = 4
"""Reload-and-retry rounds when another writer changed the worker between load and write;
past them the worker changes faster than it can be read, which is reported as an error."""

ONE_RECONNECT = Retry(NoBackoff(), 1, supported_errors=(ConnectionError,))
"""A command whose pooled connection turns out closed (Redis restarted since it was last
used) runs once more on a new one: without it, every connection pooled before an outage
fails one read after Redis is back. A timeout is not retried (a slow Redis stays slow)."""

LOAD_SETS = 128
"""Sets one members.lua call reads when a writer loads a worker: few calls for a worker of
many sessions, and Redis never busy long with one (a set is a session's blocks on a part)."""

LOAD_CALLS = 8
"""members.lua calls one load has in flight at once: with LOADS, the loads hold at most
half of a client's default places, and the reads queued behind them wait for a few calls,
not a worker's whole index."""

LOADS = 4
"""Workers whose mirrors one store loads at once. A process that starts following 1,000
workers loads every one; all at once, their members.lua calls queued in Redis past the
socket timeout and held every connection (bench/README.md, fleet_latency.py). A load
reads a worker's whole index, so a few at once keep Redis busy without a queue."""

POOL_SIZE = 64
"""Calls in flight per client unless the URL says `max_connections`: the connections of a
standalone client; on a cluster, each call holds one connection of a node at most
(`WaitingCluster`). Beyond them a caller waits for one (up to POOL_WAIT seconds) instead of
failing: a fleet of streams and a burst of API reads share the pool."""

MIN_CALLS = 2
"""The fewest calls in flight a URL may ask for: a process watching the change feed keeps
one in a blocking read most of the time (store/redis/feed.py), and every other call would
queue behind it on one."""

EXPIRE_CHUNK = 32
"""Workers an expiry pass reads or scripts per round trip (expire.lua, the forgotten check):
a pass over the whole fleet then holds the event loop, and Redis, a chunk at a time, and the
routes' reads interleave."""

POOL_WAIT = 5.0

CLOSE_SECONDS = 5.0
"""Longest wait for each step of `close`."""

_SKIPPED = ("duplicate", "previous_engine")
_NO_MIRROR = "-"
"""Expected version of a writer without a mirror: never stored, so a write answers stale."""

T = TypeVar("T")

log = structlog.get_logger(__name__)

_RECORDS = msgspec.msgpack.Encoder()


def _guard(expect: Fence | None) -> str:
    """apply.lua's ARGV[6]: the fence the writer last saw stored, or "" (no check)."""
    return "" if expect is None else f"{expect.seq} {expect.epoch_ts!r}"


def _all_applied(mirror: Mirror, batches: Sequence[Batch]) -> bool:
    """Whether the mirror's fence rule applies every batch, one after the other."""
    fence = mirror.fence
    for batch in batches:
        if decide(fence, batch.seq, batch.ts) is not ApplyOutcome.APPLIED:
            return False
        fence = advance(fence, ApplyOutcome.APPLIED, batch.seq, batch.ts)
    return True


STORE_OPTIONS = ("prefix", "registry_ttl", "feed_length")
"""Query options of the store URL that are this store's, not redis-py's."""


def _positive(url: str, options: dict[str, str], name: str, default: int, least: int = 1) -> int:
    """The URL's option `name` (taken out of `options`), or `default`; ValueError naming it
    unless an integer of at least `least`."""
    try:
        value = int(options.pop(name, str(default)))
    except ValueError:
        value = 0
    if value < least:
        what = "a positive integer" if least == 1 else f"an integer of at least {least}"
        raise ValueError(f"store URL {url!r}: {name} must be {what}")
    return value


def open_client(url: str) -> tuple[Client, dict[str, str]]:
    """A redis-py client for the store URL (its own options passed on), and the store's
    options (`STORE_OPTIONS`) taken out of the query. Raises ValueError for an unknown scheme."""
    split = urlsplit(url)
    scheme = SCHEMES.get(split.scheme)
    if scheme is None:
        raise ValueError(f"store URL {url!r}: scheme must be one of {', '.join(SCHEMES)}")
    options = dict(parse_qsl(split.query, keep_blank_values=True))
    ours = {name: options.pop(name) for name in STORE_OPTIONS if name in options}
    cluster = split.scheme.endswith("+cluster")
    calls = _positive(url, options, "max_connections", POOL_SIZE, least=MIN_CALLS)
    rest = urlunsplit((scheme, split.netloc, split.path, urlencode(options), split.fragment))
    client: Client
    if cluster:
        client = WaitingCluster.from_url(rest, calls=calls, wait=POOL_WAIT)
    else:
        client = Redis.from_pool(
            CountingPool.from_url(
                rest, retry=ONE_RECONNECT, max_connections=calls, timeout=POOL_WAIT
            )
        )
    use_hiredis_packing(client)
    keep_cancellations()
    return client, ours


class _Reply(NamedTuple):
    """apply.lua's answer: outcome (or "stale"), and the version that followed the writer's."""

    outcome: str
    next_ver: str
    next_batch: str


class _Call(NamedTuple):
    """One apply.lua call of a run in flight: its batches and its reply to come."""

    batches: int
    reply: asyncio.Future[_Reply]


NOTHING_DUE = Due([], [])
"""The directory asserts of a run's calls after its first (which carries the run's)."""


def _drop(reply: asyncio.Future[_Reply]) -> None:
    """A reply no one will read: cancelled if still to come (the connection reads and
    discards it), its error taken if it came as one (asyncio would log it as never read)."""
    if not reply.done():
        reply.cancel()
    elif not reply.cancelled():
        reply.exception()


class _Writer:
    """This process's write state for one worker: its keys, its mirror, one write at a time,
    and what it asserted in the directories."""

    __slots__ = ("asserted", "keys", "lock", "mirror", "worker")

    def __init__(self, worker: WorkerKey, keys: WorkerKeys) -> None:
        self.worker = worker
        self.keys = keys
        self.lock = asyncio.Lock()
        self.mirror: Mirror | None = None
        self.asserted = Asserted(keys)


class RedisStore(RedisReader, RedisInstances):
    """IndexStore on Redis (`redis://`, `rediss://`) or Redis Cluster (`redis[s]+cluster://`)."""

    applies_inline: ClassVar[bool] = False

    def __init__(
        self,
        client: Client,
        *,
        prefix: str = DEFAULT_PREFIX,
        registry_ttl: float = 1.0,
        feed_length: int = FEED_LENGTH,
    ) -> None:
        super().__init__(client, prefix=prefix, registry_ttl=registry_ttl)
        self._feed_length = feed_length
        self._status_script: AsyncScript = client.register_script(lua("status"))
        self._states_log_script: AsyncScript = client.register_script(lua("states_log"))
        apply_script = client.register_script(write_script("apply"))
        guard = write_script("guard")
        self._direct: DirectScript | ClusterDirectScript = (
            ClusterDirectScript(client, apply_script, guard)
            if isinstance(client, RedisCluster)
            else DirectScript(client, apply_script, guard)
        )
        self._apply_call: Callable[[list[str], list[Arg]], Awaitable[Any]] = self._direct
        self._expire_script: AsyncScript = client.register_script(lua("expire"))
        self._members_script: AsyncScript = client.register_script(lua("members"))
        self._directories = Directories(
            client,
            self._prefix,
            self._scripted,
            self._unhint_script,
            client.register_script(lua("mark")),
            self._batches,
            inline=isinstance(self._direct, DirectScript),
        )
        self._writers: dict[WorkerKey, _Writer] = {}
        self._loads = asyncio.Semaphore(LOADS)
        self._token_prefix = secrets.token_hex(6) + "."
        self._tokens = itertools.count()

    @classmethod
    def from_url(cls, url: str) -> RedisStore:
        """A store for `redis[s]://[user:pass@]host:port[/db][?options]` or `redis[s]+cluster://`.

        Options of this store, removed before the rest goes to redis-py (which takes e.g.
        `socket_timeout`): `prefix` (default `kvsi`) starts every key, so several fleets
        share one Redis; `registry_ttl` (seconds, default 1) is how long reads reuse the
        list of workers before asking Redis again (0: every read asks); `feed_length`
        (default 1000) bounds each worker's change-feed stream (XADD MAXLEN ~). redis-py's
        own options pass through. `max_connections` (default POOL_SIZE) is the calls in flight
        at once, on a cluster too (`WaitingCluster`): callers beyond it wait for a
        connection, up to POOL_WAIT seconds, rather than fail.
        """
        client, options = open_client(url)
        prefix = options.pop("prefix", DEFAULT_PREFIX)
        try:
            ttl = float(options.pop("registry_ttl", "1"))
        except ValueError:
            raise ValueError(f"store URL {url!r}: registry_ttl must be a number") from None
        feed_length = _positive(url, options, "feed_length", FEED_LENGTH)
        return cls(client, prefix=prefix, registry_ttl=ttl, feed_length=feed_length)

    def connection_waits(self) -> ConnectionWaits:
        """The client's callers that found no connection free and waited for one (on a
        cluster, for a place: `WaitingCluster`), and the seconds they waited, since the store
        opened; none for a client not opened by `open_client`. Two numbers read, no I/O. The
        replicas' roster has a client of its own, not counted here."""
        client = self._client
        if isinstance(client, WaitingCluster):
            return client.waited.read()
        pool = client.connection_pool if isinstance(client, Redis) else None
        if isinstance(pool, CountingPool):
            return pool.waited.read()
        return ConnectionWaits(0, 0.0)

    # -- batches ------------------------------------------------------------------------

    async def apply(
        self, worker: WorkerKey, batch: Batch, expect: Fence | None = None
    ) -> ApplyOutcome:
        """One EVALSHA per batch in the steady state (see `_apply`); this process's feed
        pump, if any, reads the worker's stream at once after it (`FeedPump.written`)."""
        try:
            return await self._apply(worker, batch, expect)
        finally:
            self._feed_written(worker)

    async def _apply(
        self, worker: WorkerKey, batch: Batch, expect: Fence | None = None
    ) -> ApplyOutcome:
        """One EVALSHA per batch in the steady state (see the module docstring).

        A writer without a mirror first asks with a write-less call: a replica that trails
        another on the same stream only ever sees duplicates and never loads a mirror.
        A connection error mid-call drops the mirror (whether the write landed is unknown;
        the next call reloads it from Redis), and so does a lost index (`expect`).
        Cost: O(blocks in the batch) in Python; in Redis, one variadic write per touched
        session set, one per session holding a removed block, and a few per batch.
        """
        w = self._writer(worker)
        guard = _guard(expect)
        async with w.lock:
            load = False
            for _ in range(WRITE_ATTEMPTS):
                if w.mirror is None and not load:
                    reply = await self._eval(Plan(w.keys), batch, _NO_MIRROR, "", guard)
                    if reply.outcome != "stale":
                        return self._outcome(w, reply, expect)
                    load = True
                    continue
                if w.mirror is None:
                    w.mirror = await self._load(w)
                outcome = await self._apply_with(w, w.mirror, batch, guard, expect)
                if outcome is not None:
                    return outcome
                load = True
        raise RuntimeError(f"worker {worker}: changed by another writer on every attempt")

    async def apply_many(
        self, worker: WorkerKey, batches: Sequence[Batch], expect: Fence | None = None
    ) -> list[ApplyOutcome]:
        """One EVALSHA per CALL_MAX batches when this writer's mirror predicts each applies
        (the common case of a backlog: a stream behind its publisher, a replay), each call
        planned while Redis runs the one before: the batches' writes in order, a guard and
        version check per call. From the first call Redis disagrees with (another writer; a
        lost index is raised), or when the mirror predicts otherwise, one `apply` per batch.
        Cost as `apply`'s, summed, minus a round trip and a script call per batch.
        """
        landed: list[ApplyOutcome] = []
        if len(batches) > 1:
            w = self._writer(worker)
            async with w.lock:
                mirror = w.mirror
                if mirror is not None and _all_applied(mirror, batches):
                    try:
                        landed = await self._apply_calls(w, mirror, batches, expect)
                    finally:
                        self._feed_written(worker)
        rest = batches[len(landed) :]
        return landed + [await self.apply(worker, batch, expect) for batch in rest]

    async def _apply_calls(
        self, w: _Writer, mirror: Mirror, batches: Sequence[Batch], expect: Fence | None
    ) -> list[ApplyOutcome]:
        """The batches through `mirror`, CALL_MAX to a call, two calls in flight: the next
        is planned (the client's CPU) while Redis runs the one before (its own). The run's
        directory asserts go first: before the first call on a cluster, in it on a
        standalone server. Returns the outcomes of the calls that landed, in order; from the
        first that did not, none: the mirror is dropped, and a call sent after it finds the
        version moved on (each names the version the one before leaves) and writes nothing."""
        if not mirror.registered:
            await self._register(w.worker)
            mirror.registered = True
        now = time.time()
        directories = self._directories
        due = await directories.before(w.asserted, mirror, batches, now)
        landed: list[ApplyOutcome] = []
        flight: deque[_Call] = deque()
        try:
            for start in range(0, len(batches), CALL_MAX):
                run = batches[start : start + CALL_MAX]
                asserts = due if start == 0 else NOTHING_DUE
                flight.append(await self._send_call(w, mirror, run, now, asserts, expect))
                if len(flight) == 2 and not await self._landed(w, flight.popleft(), landed, expect):
                    break
            while flight and await self._landed(w, flight.popleft(), landed, expect):
                pass
        except BaseException:
            w.mirror = None  # whether the calls in flight landed, only Redis knows
            for call in flight:
                _drop(call.reply)
            raise
        await directories.after(w.asserted, due, now)
        if landed:  # the first call landed, and the asserts with it
            directories.applied(w.asserted, due, now)
        return landed

    async def _send_call(
        self,
        w: _Writer,
        mirror: Mirror,
        run: Sequence[Batch],
        now: float,
        due: Due,
        expect: Fence | None,
    ) -> _Call:
        """Plan `run` through `mirror` (its batches' changes to residencies and seen scores
        written once, at the end) with the directory asserts `due`, and send it; the reply
        comes later (`_landed`)."""
        before = mirror.ver
        plan = Plan(w.keys)
        for i, batch in enumerate(run, 1):
            token = self._token()
            mirror.apply(batch, ApplyOutcome.APPLIED, token, now, last=i == len(run), into=plan)
            mirror.ver = token  # the next batch's version log entry follows this one
        self._directories.inline(plan, w.asserted, due, now)
        call = self._eval(plan, run[0], before, "applied", _guard(expect))
        reply = asyncio.ensure_future(call)
        try:
            await asyncio.sleep(0)  # the call is queued on its connection...
        except BaseException:
            _drop(reply)
            raise
        self._direct.flush()  # ...and written now, before the next call is planned
        return _Call(len(run), reply)

    async def _landed(
        self, w: _Writer, call: _Call, landed: list[ApplyOutcome], expect: Fence | None
    ) -> bool:
        """Whether `call` was applied (then its outcomes join `landed`); if not, the mirror
        is dropped (and a lost index raised: only a guarded call is answered "lost")."""
        reply = await call.reply
        if reply.outcome == "applied":
            landed += [ApplyOutcome.APPLIED] * call.batches
            return True
        w.mirror = None
        if reply.outcome == "lost":
            self._outcome(w, reply, expect)
        return False

    async def _apply_with(
        self, w: _Writer, mirror: Mirror, batch: Batch, guard: str, expect: Fence | None
    ) -> ApplyOutcome | None:
        """Apply through `mirror`; None if it was stale (then dropped: the caller reloads)."""
        predicted = decide(mirror.fence, batch.seq, batch.ts)
        if predicted.value in _SKIPPED:
            reply = await self._eval(Plan(w.keys), batch, mirror.ver, "", guard)
            if reply.outcome == "stale":
                w.mirror = None
                return None
            return self._outcome(w, reply, expect)
        if not mirror.registered:
            await self._register(w.worker)
            mirror.registered = True
        token = self._token()
        before = mirror.ver
        now = time.time()
        restarted = predicted is ApplyOutcome.RESTARTED
        directories = self._directories
        try:
            due = await directories.before(w.asserted, mirror, (batch,), now, restarted=restarted)
            plan = mirror.apply(batch, predicted, token, now)
            directories.inline(plan, w.asserted, due, now)
            reply = await self._eval(plan, batch, before, predicted.value, guard)
        except BaseException:
            # The write may or may not have landed; only Redis knows: reload on next use.
            w.mirror = None
            raise
        await directories.after(w.asserted, due, now)
        if reply.outcome == predicted.value:
            mirror.ver = token
            directories.applied(w.asserted, due, now)
            if restarted or any(e.kind == CLEARED for e in batch.events):
                await directories.cleared(w.keys)
            return predicted
        if reply.outcome in _SKIPPED and reply.next_batch == batch_id(batch):
            # Another writer (or this one, its reply lost and the call retried) applied
            # this very batch on the version this mirror had: the mutated mirror is exact.
            mirror.ver = reply.next_ver
            return predicted if reply.next_ver == token else ApplyOutcome(reply.outcome)
        w.mirror = None
        return None if reply.outcome == "stale" else self._outcome(w, reply, expect)

    @staticmethod
    def _outcome(w: _Writer, reply: _Reply, expect: Fence | None) -> ApplyOutcome:
        """apply.lua's outcome; "lost" raises IndexLostError (and drops the mirror)."""
        if reply.outcome != "lost":
            return ApplyOutcome(reply.outcome)
        w.mirror = None
        assert expect is not None  # apply.lua answers "lost" only to a guarded call
        stored = int(reply.next_ver) if reply.next_ver else None
        raise IndexLostError(w.worker, stored, expect)

    async def _eval(
        self, plan: Plan, batch: Batch | None, expected: str, predicted: str, guard: str = ""
    ) -> _Reply:
        """Run apply.lua: in batch mode with the fence rule (and `guard`, a fence expected
        stored), else (`batch` None) op mode."""
        head: list[Arg]
        if batch is None:
            head = ["op", "", "", expected, "applied", ""]
        else:
            head = ["batch", batch.seq, batch.ts, expected, predicted, guard]
        plan.seal()
        raw = await self._apply_call(plan.keys, head + plan.ops)
        return _Reply(raw[0].decode(), raw[2].decode(), raw[3].decode())

    async def _load(self, w: _Writer) -> Mirror:
        """Read the worker's whole index into a new Mirror; again if it changed meanwhile.

        Cost: O(worker entries): a pipeline, then the sets through members.lua (calls at
        once) and the version again; once per worker and process, and again only after
        another writer took over, or an error. At most LOADS at once: a load waits its turn.
        """
        async with self._loads:
            return await self._load_now(w)

    async def _load_now(self, w: _Writer) -> Mirror:
        keys = w.keys
        for _ in range(WRITE_ATTEMPTS):
            pipe = self._pipeline()
            pipe.hgetall(keys.meta)
            pipe.hgetall(keys.parts)
            pipe.hgetall(keys.res)
            pipe.smembers(keys.firsts)
            pipe.hgetall(keys.tokens)
            meta, parts, residencies, firsts, edges = await pipe.execute()
            ver = meta.get(b"ver", b"").decode()
            mirror = Mirror(
                keys, ver, fence_of(meta), has_status=b"since" in meta, indexed=b"idx" in meta
            )
            mirror.feed_length = self._feed_length
            mirror.registered = bool(meta)
            if mirror.registered and self._registry is not None:
                self._registry.add(w.worker)  # reads here see what this process writes
            for pid, raw in parts.items():
                mirror.index.add_part(int(pid), *decode_part(raw))
            sets: list[str] = []
            held = []
            # Oldest first: the mirror keeps residencies in last-store order (expiry).
            for sid, raw in sorted(residencies.items(), key=lambda kv: residency_time(kv[1])):
                t, counts = decode_residency(raw)
                res = mirror.add_residency(sid.decode(), t, decode_progress(raw))
                for pid in counts:
                    sets.append(keys.session(pid, res.session_id))
                    held.append((mirror.index.by_pid[pid], res))
            for part in mirror.index.by_pid.values():
                sets += (part.orphans_key, part.unconfirmed_key)
            out = await self._members(sets)
            # Every write changes the version: the same one after every read, no write between.
            if ((await self._client.hget(keys.meta, "ver")) or b"") != ver.encode():
                continue
            for (part, res), members in zip(held, out[: len(held)], strict=True):
                mirror.index.load(part, res, map(hash_of, members))
            rest = iter(out[len(held) :])
            for part in mirror.index.by_pid.values():
                mirror.index.load_orphans(part, map(hash_of, next(rest)))
                part.pending = {hash_of(m) for m in next(rest)}
            mirror.index.tokens.load(parse_edge(f, v) for f, v in edges.items())
            if mirror.registered:
                await self._directories.loaded(w.asserted, mirror, meta, firsts)
            return mirror
        raise RuntimeError(f"worker {w.worker}: changed on every attempt to load it")

    async def _members(self, sets: list[str]) -> list[list[bytes]]:
        """The members of every set of one worker, in order: members.lua over LOAD_SETS
        sets a call, LOAD_CALLS calls at once (one reply each, not one command per set)."""
        chunks = [sets[i : i + LOAD_SETS] for i in range(0, len(sets), LOAD_SETS)]
        replies: list[list[list[bytes]]] = []
        for start in range(0, len(chunks), LOAD_CALLS):
            wave = chunks[start : start + LOAD_CALLS]
            replies += await asyncio.gather(*(self._members_script(keys=c) for c in wave))
        return [members for reply in replies for members in reply]

    def _writer(self, worker: WorkerKey) -> _Writer:
        w = self._writers.get(worker)
        if w is None:
            w = self._writers[worker] = _Writer(worker, self.worker_keys(worker))
        return w

    def _token(self) -> str:
        """A version no other write ever used: this process's random prefix and a counter."""
        return f"{self._token_prefix}{next(self._tokens)}"

    async def _register(self, worker: WorkerKey) -> None:
        """Add the worker to the registry, before its first write, so reads never miss it;
        its meta says its directory entries are complete (every residency is new)."""
        pipe = self._pipeline()
        pipe.sadd(self._registry_key, worker_member(worker))
        self._directories.marks(pipe, self.worker_keys(worker))
        await pipe.execute()
        if self._registry is not None:
            self._registry.add(worker)

    # -- other writes ---------------------------------------------------------------------

    async def _write_op(
        self, worker: WorkerKey, build: Callable[[Mirror, str], tuple[Plan, T]], absent: T
    ) -> T:
        """A non-batch write, `build(mirror, version) -> (plan, result)`, on a current mirror.

        `absent` is the result for a worker Redis does not know, which stays unknown.
        """
        w = self._writer(worker)
        async with w.lock:
            for _ in range(WRITE_ATTEMPTS):
                mirror = w.mirror
                if mirror is None or not mirror.registered:
                    # An unknown worker may have been created elsewhere since: look again.
                    mirror = w.mirror = await self._load(w)
                if not mirror.registered:
                    return absent
                token = self._token()
                try:
                    plan, result = build(mirror, token)
                    reply = await self._eval(plan, None, mirror.ver, "applied")
                except BaseException:
                    w.mirror = None
                    raise
                if reply.outcome == "applied":
                    mirror.ver = token
                    return result
                w.mirror = None
        raise RuntimeError(f"worker {worker}: changed by another writer on every attempt")

    async def set_status(
        self, worker: WorkerKey, status: WorkerStatus, epoch: int | None = None
    ) -> bool:
        """status.lua on the worker's meta (which also adds a feed record when the state or
        detail changed, atomically: once, whichever process wrote; and refuses an older
        `epoch` than the meta's), and SADD to the registry, concurrently; then, if the state,
        detail or model changed, states_log.lua: INCR of the states counter readers check, and
        the worker in the states log, so they read its state and model again, not every
        worker's. Not versioned: the status is no part of the index a mirror copies. O(1)."""
        keys = self.worker_keys(worker)
        change = WorkerChange(
            worker.pod, worker.dp_rank, status.state.value, status.since, status.detail
        )
        record = FeedRecord(worker.pod, worker.dp_rank, status.since, state=change)
        _, changed = await asyncio.gather(
            self._client.sadd(self._registry_key, worker_member(worker)),
            self._status_script(
                keys=[keys.meta, keys.feed],
                args=[
                    status.state.value,
                    status.since,
                    status.detail,
                    status.batches_lost,
                    self._feed_length,
                    _RECORDS.encode(record),
                    status.model or "",
                    status.gaps,
                    status.replays,
                    status.restarts,
                    status.lag_batches,
                    status.lag_seconds,
                    "" if epoch is None else epoch,
                ],
            ),
        )
        if self._registry is not None:
            self._registry.add(worker)
        if changed == -1:
            return False
        if changed == 1:
            self._feed_written(worker)
        if changed:  # after the status: a reader that sees the count reads the new status
            await self._log_status(worker)
        self._model_written(worker, status.model)  # after the log: a refresh then reads it
        return True

    async def _log_status(self, worker: WorkerKey) -> None:
        """states_log.lua: the worker's status (state, detail, model) changed."""
        await self._states_log_script(
            keys=[self._states_key, self._states_log],
            args=[worker_member(worker), STATES_LOG_LENGTH],
        )

    async def mark_unconfirmed(self, worker: WorkerKey) -> int:
        """SUNIONSTORE of each part's sets into its unconfirmed set, in Redis; the mirror
        keeps the same set, and later stores and removals shrink both. O(worker entries),
        plus loading the mirror if this process has none."""
        return await self._write_op(worker, Mirror.mark_unconfirmed, 0)

    async def drop_unconfirmed(self, worker: WorkerKey) -> int:
        """SREMs from the holders' sets, worked out from the mirror (loaded if absent).
        O(unconfirmed entries x sessions holding each)."""
        return await self._write_op(worker, Mirror.drop_unconfirmed, 0)

    async def clear_worker(self, worker: WorkerKey) -> None:
        """DEL of the worker's set keys and residency hash, named by its mirror (no SCAN).
        O(its keys), plus loading the mirror if this process has none."""
        await self._write_op(worker, lambda m, token: (m.clear(token), None), None)
        mirror = self._writer(worker).mirror
        if mirror is not None and mirror.registered:
            await self._directories.cleared(self.worker_keys(worker))

    async def remove_worker(self, worker: WorkerKey) -> None:
        """Every key of the worker, named by its mirror, then its registry entry.

        Its sessions' last_seen goes first to the retired record (ZADD LT), so sessions
        seen there outlive it until they expire, as in the memory store. A writer still
        streaming the worker re-creates and re-registers it with its next batch, and a
        session first seen on it between the copy and the removal is forgotten early. The
        removal is logged as a status change: readers' caches of states and models read
        the worker again (a worker re-created meanwhile then shows its new meta's).
        O(its keys + entries + sessions).
        """
        started = time.time()
        keys = self.worker_keys(worker)
        pipe = self._pipeline()
        pipe.zrange(keys.seen, 0, -1, withscores=True)
        pipe.smembers(keys.firsts)
        seen, firsts = cast(tuple[list[tuple[bytes, float]], set[bytes]], await pipe.execute())
        for start in range(0, len(seen), MAX_ARGS):
            await self._client.zadd(
                self._retired_key, dict(seen[start : start + MAX_ARGS]), lt=True
            )
        await self._write_op(worker, lambda m, token: (m.remove(), None), None)
        sessions = [sid.decode() for sid, _ in seen]
        await self._directories.dropped(worker_member(worker), sessions, firsts, started)
        await self._client.srem(self._registry_key, worker_member(worker))
        if self._registry is not None:
            self._registry.discard(worker)
        await self._log_status(worker)  # readers drop its cached state and model
        await self.release(worker)

    async def release(self, worker: WorkerKey) -> None:
        """The worker's writer (its mirror) and directory marks go; Redis is not touched.
        A write in flight keeps its own reference and ends as it would."""
        self._writers.pop(worker, None)
        self._directories.forget(worker)

    async def expire_sessions(
        self, older_than: float, limit: int, *, written_only: bool = False
    ) -> Expired:
        """Workers this process writes (a current mirror): their idle residencies through
        the mirror, one apply.lua call per worker (`_expire_written`); with `written_only`,
        nothing else. Every other worker, and the retired record: expire.lua drops the idle
        residencies holding no block (those holding blocks wait for their writer: dropping
        them needs the reverse map). Then one pipeline over every worker tells which of the
        dropped sessions have no record left (forgotten). O(dropped residencies' blocks +
        workers) commands' work; O(written workers') with `written_only`.
        """
        dropped: list[str] = []
        more = False
        mine: set[str] = set()
        for w in list(self._writers.values()):
            done = await self._expire_written(w, older_than, limit)
            if done is not None:
                mine.add(w.keys.seen)
                dropped += done[0]
                more = more or done[1]
        if written_only:
            return Expired(len(dropped), 0, more)
        await self._directories.complete_others(await self._known(), self.worker_keys)
        sources = await self._seen_sources(None)
        others = [s for s in sources if s.seen not in mine]
        replies = []
        for start in range(0, len(others), EXPIRE_CHUNK):  # the routes' reads interleave
            replies += await asyncio.gather(
                *(
                    self._expire_script(
                        keys=s.keys(),
                        args=[repr(-older_than), limit],
                    )
                    for s in others[start : start + EXPIRE_CHUNK]
                )
            )
        records = 0  # the retired record's drops are records of sessions, not residencies
        for source, reply in zip(others, replies, strict=True):
            more = more or reply[0] == b"1"
            dropped += [sid.decode() for sid in reply[1:]]
            if source.res is None:
                records += len(reply) - 1
        return Expired(len(dropped) - records, await self._forgotten(sources, dropped), more)

    async def _expire_written(
        self, w: _Writer, older_than: float, limit: int
    ) -> tuple[list[str], bool] | None:
        """Drop up to `limit` idle residencies of a worker through its writer's mirror,
        guarded by the version like any write; None if this process has no current mirror
        (a stale one is dropped: the worker's next batch loads it again)."""
        started = time.time()
        async with w.lock:  # no write of this worker runs meanwhile
            mirror = w.mirror
            if mirror is None or not mirror.registered:
                return None
            await self._directories.upkeep(w.asserted, mirror, started)
            due = mirror.index.idle(older_than, limit)
            more = len(due) > limit
            due = due[:limit]
            if not due:
                return [], more
            pipe = self._pipeline()
            pipe.hmget(w.keys.res, [r.session_id for r in due])
            for res in due:
                for pid in res.counts():
                    pipe.smembers(mirror.keys.session(pid, res.session_id))
            out = await pipe.execute()
            sets = iter(out[1:])
            held = [
                (res, {pid: [hash_of(m) for m in next(sets)] for pid in res.counts()})
                for res in due
            ]
            token = self._token()
            try:
                plan = mirror.expire(held, token)
                reply = await self._eval(plan, None, mirror.ver, "applied")
            except BaseException:
                w.mirror = None
                raise
            if reply.outcome != "applied":
                w.mirror = None
                return None
            mirror.ver = token
            gone = [r.session_id for r in due]
            for sid in gone:
                w.asserted.sessions.pop(sid, None)
            await self._directories.dropped(w.asserted.member, gone, (), started)
            # Those another process dropped already (no residency left) are not counted.
            return [r.session_id for r, raw in zip(due, out[0], strict=True) if raw], more

    async def _forgotten(self, sources: list[Seen], dropped: list[str]) -> int:
        """How many of the sessions whose residencies were just dropped have no record
        left on any worker or in the retired record. O(sources) commands, `EXPIRE_CHUNK` a
        round trip."""
        ids = sorted(set(dropped))
        forgotten = 0
        for start in range(0, len(ids), MAX_ARGS):
            chunk = ids[start : start + MAX_ARGS]
            reads: list[Command] = [(s.seen, ("ZMSCORE", s.seen, *chunk), {}) for s in sources]
            scores = await self._batches(reads, EXPIRE_CHUNK)
            forgotten += sum(1 for i in range(len(chunk)) if all(s[i] is None for s in scores))
        return forgotten

    async def close(self) -> None:
        """The feed pump, the direct connection, the pool: each step bounded by
        CLOSE_SECONDS (logged if it runs out), so a stuck step cannot hang a shutdown. A
        test's teardown once waited 300 s here, cause not found (issue 8's note)."""
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("feed pump", self._stop_feed),
            ("direct connection", self._direct.aclose),
            ("connections", self._client.aclose),
        ]
        for name, step in steps:
            try:
                async with asyncio.timeout(CLOSE_SECONDS):
                    await step()
            except TimeoutError:
                log.warning("store.close_slow", step=name, seconds=CLOSE_SECONDS, then="left")
