"""The Redis store's read side: every query the API makes, answered from Redis alone.

Imports neither zmq nor fastapi, nor the writer's mirror: an API-only replica has none.
Queries fan out over the registered workers in pipelines (one round trip per Redis node
each), and never SCAN the keyspace. Layout: store/README.md.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Container,
    Iterable,
    Mapping,
    Sequence,
)
from importlib import resources
from typing import Any, NamedTuple, TypeVar, cast

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from kvsi.store.directory import BLOCK_DIRECTORY_MARK, SAFE_SECONDS, block_key, hint_key
from kvsi.store.feed import FeedHub
from kvsi.store.model import (
    Fence,
    Frontier,
    Hash,
    Page,
    SessionOnWorker,
    SessionSummary,
    SessionView,
    WorkerKey,
    WorkerLosses,
    WorkerState,
    WorkerStatus,
    WorkerView,
    reprefill_tokens,
)
from kvsi.store.paging import (
    SessionOrder,
    decode_session_cursor,
    encode_session_cursor,
    page_hashes,
    page_sessions,
)
from kvsi.store.redis.feed import FeedPump, stream_ends
from kvsi.store.redis.field_cache import FieldCache, Logged, read_log
from kvsi.store.redis.known_workers import KnownWorkers
from kvsi.store.redis.layout import (
    LOSS_FIELDS,
    META_FENCE,
    Progress,
    WorkerKeys,
    bucket,
    check_prefix,
    decode_losses,
    decode_part,
    decode_progress,
    decode_residency,
    hash_of,
    member,
    parse_edge,
    parse_worker,
    registry_key,
    residency_time,
    retired_key,
    states_key,
    states_log_key,
    worker_member,
)
from kvsi.store.redis.node_reads import WITH_SCORES, Command, NodeReads
from kvsi.store.redis.plan import MAX_ARGS, Arg
from kvsi.store.tokens import Edge

Client = Redis | RedisCluster
T = TypeVar("T")

HELD_CONNECTIONS = 4
"""Connections the read scripts hold (`_ReadConnections`): the prefix match and session
lookup of two routes at once; further concurrent calls take the client's pool. At most
half of the pool (`max_connections`) less one connection, the change feed's: a small pool
is never held whole by them and the feed pump's blocking reads."""

SCAN_CHUNK = 4
"""Workers whose whole residency hash one round trip of `list_sessions(order="blocks")`
reads: a few ms of Redis each, so the routes' reads interleave."""

LIST_CHUNK = 64
"""Workers whose meta one round trip of `list_workers` reads: the refreshers that list the
fleet (index gauges, the janitor) then hold the event loop for a chunk's replies at a
time, not the whole fleet's, and the routes' reads interleave."""

LOSS_CHUNK = 1
"""Workers without loss sums in their meta (written before them) `worker_losses` sums per
round trip: losses.lua holds Redis for time in proportion to a worker's residencies, so
reads wait behind at most one worker's sum."""

FIELD_CHUNK = 256
"""Workers one round trip of a read of one meta field (states, models) covers: more than
`LIST_CHUNK`, as each answers a few bytes, and requests may be waiting for the read."""

STATES_LOG_READ = 256
"""Most states-log entries a refresh reads (`states_since.lua`): further behind, it reads
every worker's state (a few more commands per worker than per entry, as often)."""

STATES_LOG_LENGTH = 1_000
"""The states log's bound (XADD MAXLEN ~): more than `STATES_LOG_READ`, fewer than a busy
fleet's changes in a few `registry_ttl`s."""

STATES_READ_SECONDS = 30.0
"""Longest a reader trusts the states log alone: every worker's state and model are read
again at least this often (a writer that died between a status and its log entry)."""

Place = tuple[float, str]
"""A session's place in the listing: (-last_seen, session id), ascending."""


class Seen(NamedTuple):
    """Where sessions are recorded: a worker (its seen set and residencies), or `retired`."""

    seen: str
    res: str | None
    counted: bool
    """Its blocks count in a listing (the listing's pod filter)."""
    meta: str | None = None
    """The worker's meta hash (None for `retired`)."""

    def keys(self) -> list[str]:
        """expire.lua's KEYS for this record."""
        if self.res is None or self.meta is None:
            return [self.seen]
        return [self.seen, self.res, self.meta]


class Located(NamedTuple):
    """A session's residency on one worker, as `_locate` found it."""

    worker: WorkerKey
    raw: bytes
    """The residency value (`store.redis.layout.decode_residency`, `decode_progress`)."""
    parts: dict[bytes, bytes]
    """The worker's parts hash (pid -> `<group>|<medium>`) when the residency holds blocks
    (read with it, so both are of one moment), else empty."""


def lua(name: str) -> str:
    """The source of store/redis/lua/<name>.lua."""
    return resources.files("kvsi.store.redis").joinpath("lua", f"{name}.lua").read_text()


def write_script(name: str) -> str:
    """check.lua, then <name>.lua: a script that starts with the write checks, without its
    comment lines and indentation (a script sent whole with every call is hashed by Redis
    at each one: the shorter the cheaper)."""
    lines = (line.strip() for line in (lua("check") + lua(name)).splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


_FENCE_FIELDS = [name.encode() for name in META_FENCE]


def fence_of(meta: Mapping[bytes, bytes | None]) -> Fence | None:
    """The fence in a worker's meta hash, None before its first batch."""
    seq, epoch, last = map(meta.get, _FENCE_FIELDS)
    if seq is None or epoch is None or last is None:
        return None
    return Fence(seq=int(seq), epoch_ts=float(epoch), last_ts=float(last))


def _medium(parts: dict[bytes, bytes], pid: int) -> str | None:
    """The medium of part `pid`; None if unknown (the worker was removed meanwhile)."""
    raw = parts.get(str(pid).encode())
    return None if raw is None else decode_part(raw)[0]


def _by_medium(counts: dict[int, int], parts: dict[bytes, bytes]) -> dict[str, int] | None:
    """Blocks per medium; None if a part is unknown (the worker was removed meanwhile)."""
    out: dict[str, int] = {}
    for pid, n in counts.items():
        medium = _medium(parts, pid)
        if medium is None:
            return None
        out[medium] = out.get(medium, 0) + n
    return out


def _on_worker(
    w: WorkerKey, last_seen: float, by_medium: dict[str, int], progress: Progress
) -> SessionOnWorker:
    h = progress.frontier
    return SessionOnWorker(
        pod=w.pod,
        dp_rank=w.dp_rank,
        blocks=sum(by_medium.values()),
        by_medium=by_medium,
        last_seen=last_seen,
        lost_blocks=progress.lost,
        reprefill_tokens=reprefill_tokens(progress.lost, progress.block_size),
        frontier=None if h is None else Frontier(h, progress.position),
    )


def _view(w: WorkerKey, meta: dict[bytes, bytes]) -> WorkerView:
    """The worker's view from its meta hash."""
    fence = fence_of(meta)
    event_at = meta.get(b"event_at")
    return WorkerView(
        pod=w.pod,
        dp_rank=w.dp_rank,
        blocks=int(meta.get(b"blocks", 0)),
        sessions=int(meta.get(b"sessions", 0)),
        last_seq=fence.seq if fence else None,
        last_event_at=float(event_at) if event_at is not None else None,
        status=WorkerStatus(
            state=_state(meta.get(b"state")),
            since=float(meta.get(b"since", 0.0)),
            detail=meta.get(b"detail", b"").decode(),
            batches_lost=int(meta.get(b"lost", 0)),
            model=_text(meta.get(b"model")),
            gaps=int(meta.get(b"gaps", 0)),
            replays=int(meta.get(b"replays", 0)),
            restarts=int(meta.get(b"restarts", 0)),
            lag_batches=int(meta.get(b"lag", 0)),
            lag_seconds=float(meta.get(b"lag_s", 0.0)),
        ),
        unconfirmed=int(meta.get(b"unconfirmed", 0)),
    )


def _state(raw: bytes | None) -> WorkerState:
    """A worker's state field; a worker with no status written yet is connecting."""
    return WorkerState(raw.decode()) if raw else WorkerState.CONNECTING


def _text(raw: bytes | None) -> str | None:
    """An optional text field of a meta hash (absent: None)."""
    return None if raw is None else raw.decode()


def _hashes(found: Iterable[Iterable[bytes]]) -> set[Hash]:
    return {hash_of(m) for members in found for m in members}


def _places(found: list[tuple[bytes, float]]) -> list[Place]:
    return [(score, sid.decode()) for sid, score in found]


class _ReadConnections:
    """The read scripts' EVALSHA on a standalone server, over a few connections held out of
    the client's pool, each used by one call at a time; a call finding them all busy takes
    the client's command path.

    redis-py's command path (pool checkout and release under a lock, per-command timeouts
    and hooks) costs more client CPU than the call itself (bench/README.md,
    route_latency.py), and a route makes two. Held out of the pool, the
    connections count there as in use, so closing the client closes them. Failures are the
    command path's: redis-py drops a connection on any error (a reply left unread by a
    cancelled call included) and connects again on its next call, a connection error is
    retried as the client's `retry` says, and NOSCRIPT (a restarted server) loads the script
    again.
    """

    def __init__(self, client: Redis) -> None:
        self._client = client
        self._idle: list[AbstractConnection] = []
        self._held = 0
        self._most_held = min(HELD_CONNECTIONS, (client.connection_pool.max_connections - 1) // 2)

    async def evalsha(self, script: AsyncScript, keys: list[str], args: Sequence[Arg]) -> Any:
        try:
            return await self._call("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            script.sha = await self._client.script_load(script.script)
            return await self._call("EVALSHA", script.sha, len(keys), *keys, *args)

    async def _call(self, *command: Arg) -> Any:
        client = self._client
        if self._idle:
            conn = self._idle.pop()
        elif self._held < self._most_held:
            self._held += 1
            pool = client.connection_pool
            try:
                conn = await pool.get_connection()  # type: ignore[no-untyped-call]
            except BaseException:
                self._held -= 1
                raise
        else:
            return await client.execute_command(*command)  # type: ignore[no-untyped-call]

        async def once() -> Any:
            await conn.send_command(*command)
            return await conn.read_response()

        try:
            return await conn.retry.call_with_retry(once, lambda _: conn.disconnect())
        finally:
            self._idle.append(conn)


class SharedCall:
    """Concurrent callers of `call()` share one run of `fetch` (the one in flight, if any).

    The run is shielded: a caller cancelled while waiting does not cancel it for the others.
    """

    def __init__(self, fetch: Callable[[], Awaitable[None]]) -> None:
        self._fetch = fetch
        self._running: asyncio.Task[None] | None = None

    async def __call__(self) -> None:
        if self._running is None:
            self._running = asyncio.ensure_future(self._fetch())
            self._running.add_done_callback(self._done)
        await asyncio.shield(self._running)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running = None
        if not task.cancelled():
            task.exception()  # retrieved here too: every waiter may have been cancelled


class RedisReader:
    """Reads of the index (the read half of the IndexStore contract) over a Redis client."""

    def __init__(self, client: Client, *, prefix: str, registry_ttl: float) -> None:
        self._client = client
        self._prefix = check_prefix(prefix)
        self._registry_key = registry_key(prefix)
        self._states_key = states_key(prefix)
        self._states_log = states_log_key(prefix)
        self._retired_key = retired_key(prefix)
        self._registry_ttl = registry_ttl
        self._registry: KnownWorkers | None = None
        self._registry_at = 0.0
        self._keys: dict[WorkerKey, WorkerKeys] = {}
        self._reads = _ReadConnections(client) if isinstance(client, Redis) else None
        """A standalone server answers a prefix match or a session lookup over every worker
        in one script call; a cluster's workers span slots (one call or command per worker)."""
        self._nodes = NodeReads(client) if isinstance(client, RedisCluster) else None
        """The per-request reads' rounds on a cluster, and the writers' directory asserts
        (`_batch`)."""
        self._prefix_script: AsyncScript = client.register_script(lua("prefix"))
        self._locate_script: AsyncScript = client.register_script(lua("locate"))
        self._losses_script: AsyncScript = client.register_script(lua("losses"))
        self._unhint_script: AsyncScript = client.register_script(lua("unhint"))
        self._walk_script: AsyncScript = client.register_script(lua("walk"))
        self._states_since_script: AsyncScript = client.register_script(lua("states_since"))
        self._block_marked: set[WorkerKey] = set()
        """Workers whose meta says the block directory holds all their first blocks."""
        self._legacy_at = -math.inf
        self._legacy: tuple[WorkerKey, ...] = ()
        self._legacy_version = -1
        """The registered workers not in `_block_marked`, at the registry's version then."""
        self._states = FieldCache("state", _state)
        self._models = FieldCache("model", _text)
        self._registry_refresh = SharedCall(self._read_registry)
        self._states_refresh = SharedCall(lambda: self._refresh_field(self._states))
        self._marks_refresh = SharedCall(self._read_block_marks)
        self._models_refresh = SharedCall(lambda: self._refresh_field(self._models))
        """One read of each cache at a time: when it goes stale under load, the requests in
        flight would each have read all of it again (every worker's commands per request;
        a new API process's first prefix matches each asked every worker for its mark:
        bench/README.md, fleet_latency.py), they now wait for the one read."""
        self._hub = FeedHub()
        self._pump: FeedPump | None = None
        self._pump_lock = asyncio.Lock()

    def worker_keys(self, worker: WorkerKey) -> WorkerKeys:
        """The worker's key names (cached: building them costs more than using them)."""
        keys = self._keys.get(worker)
        if keys is None:
            keys = self._keys[worker] = WorkerKeys(self._prefix, worker)
        return keys

    async def _known(self, fresh: bool = False) -> tuple[WorkerKey, ...]:
        """Registered workers in order, from a cache at most `registry_ttl` old (unless
        `fresh`). O(1) while the registry is unchanged.

        The cache spares every query a round trip to the registry's node; this process's
        own registrations and removals update it at once, other processes' after the ttl.
        """
        return (await self._known_workers(fresh)).ordered()

    async def _known_workers(self, fresh: bool = False) -> KnownWorkers:
        now = time.monotonic()
        if fresh or self._registry_ttl <= 0:  # not a read another caller started earlier
            await self._read_registry()
        elif self._registry is None or now - self._registry_at >= self._registry_ttl:
            await self._registry_refresh()
        assert self._registry is not None
        return self._registry

    async def _read_registry(self) -> None:
        started = time.monotonic()
        raw = cast(set[bytes], await self._client.smembers(self._registry_key))
        found = {parse_worker(m) for m in raw}
        if self._registry is None:
            self._registry = KnownWorkers(found)
        else:
            self._registry.replace(found)
        self._registry_at = started

    def _pipeline(self) -> Any:
        return self._client.pipeline(transaction=False)

    async def _batch(self, commands: Sequence[Command], raise_on_error: bool = True) -> list[Any]:
        """The replies of `commands`, one round trip per node: on a cluster by `NodeReads`
        (the client's pipeline when it cannot: an error, a redirection), else the pipeline.
        With `raise_on_error` false an error reply is returned in its place."""
        if not commands:
            return []
        if self._nodes is not None:
            out = await self._nodes.run(commands)
            if out is not None:
                return out
        pipe = self._pipeline()
        for _, args, options in commands:
            pipe.execute_command(*args, **options)
        return cast(list[Any], await pipe.execute(raise_on_error=raise_on_error))

    async def _rounds(
        self, commands: Sequence[Command], per_round: int
    ) -> AsyncIterator[tuple[slice, list[Any]]]:
        """`_batch` of `per_round` commands at a time, each round's replies as they come
        (with the round's slice of `commands`): a pass over the fleet holds the event loop
        (and each node) for one round's replies, and the caller's work on them, at a time,
        and the routes' reads interleave."""
        for start in range(0, len(commands), per_round):
            part = slice(start, start + per_round)
            yield part, await self._batch(commands[part])

    async def _batches(self, commands: Sequence[Command], per_round: int) -> list[Any]:
        """Every round's replies of `_rounds`, in order."""
        out: list[Any] = []
        async for _, replies in self._rounds(commands, per_round):
            out += replies
        return out

    async def fence(self, worker: WorkerKey) -> Fence | None:
        """Read from Redis (not a mirror): another replica may have advanced it. O(1)."""
        meta = self.worker_keys(worker).meta
        (values,) = await self._batch([(meta, ("HMGET", meta, *META_FENCE), {})])
        return fence_of(dict(zip(_FENCE_FIELDS, values, strict=True)))

    async def get_session(self, session_id: str) -> SessionView | None:
        """Where the session is, with the parts hash of each worker holding some of it to name
        the media (`_locate`): one script call on a standalone server, two pipelined rounds on
        a cluster. O(workers)."""
        found = await self._locate(session_id)
        if found is None:
            return None
        last_seen, located = found
        views = []
        for w, raw, parts in located:
            t, counts = decode_residency(raw)
            progress = decode_progress(raw)
            if counts:
                by_medium = _by_medium(counts, parts)
                if by_medium is not None:
                    views.append(_on_worker(w, t, by_medium, progress))
            elif progress.lost:  # no blocks left, but eviction took some: shown
                views.append(_on_worker(w, t, {}, progress))
        views.sort(key=lambda s: (-s.blocks, s.pod, s.dp_rank))
        return SessionView(
            session_id=session_id,
            total_blocks=sum(v.blocks for v in views),
            last_seen=last_seen,
            workers=views,
        )

    async def _locate(self, session_id: str) -> tuple[float, list[Located]] | None:
        """The session's last_seen and its residency per worker holding a record of it, with
        the parts hash of those holding blocks; None if never seen. Only the workers the
        session's directory set names are read (`directory.py`), pruning the entries it no
        longer needs. On a cluster two rounds (`_batch`): ZRANGE of the directory set, then
        HGET of the residency and HGETALL of the parts hash per named worker; ZSCORE of the
        retired record in the first if the directory's node serves it, else in the second."""
        prune = time.time() - SAFE_SECONDS
        key = hint_key(self._prefix, session_id)
        if self._reads is not None:
            return await self._locate_in_one_call(self._reads, key, session_id, prune)
        retired_read: Command = (self._retired_key, ("ZSCORE", self._retired_key, session_id), {})
        # The retired record goes with the directory when one node serves both, else with
        # the workers' reads (a worker's node may serve it): on a node of its own it costs
        # a write and a read either way.
        early = self._nodes is None or self._nodes.same_node(self._retired_key, key)
        directory: Command = (key, ("ZRANGE", key, 0, -1, "WITHSCORES"), WITH_SCORES)
        first = await self._batch([retired_read, directory] if early else [directory])
        hinted = first[-1]
        reads: list[Command] = []
        for raw, _ in hinted:
            keys = self.worker_keys(parse_worker(raw))
            reads.append((keys.res, ("HGET", keys.res, session_id), {}))
            reads.append((keys.parts, ("HGETALL", keys.parts), {}))
        if not early:
            reads.append(retired_read)
        out = await self._batch(reads)
        retired = first[0] if early else out.pop()
        seen = [-float(retired)] if retired is not None else []
        located = []
        stale = []
        for (raw, score), res, parts in zip(hinted, out[0::2], out[1::2], strict=True):
            if res is not None:
                seen.append(residency_time(res))
                located.append(Located(parse_worker(raw), res, parts if b" " in res else {}))
            elif score < prune:
                stale.append(raw.decode())
        if stale:
            await self._prune(key, stale, prune)
        if not seen:
            return None
        return max(seen), located

    async def _prune(self, key: str, members: list[str], no_newer_than: float) -> None:
        """Drop directory entries a read found stale (unhint.lua, one pipeline)."""
        await self._scripted(
            self._unhint_script, [([key], [m, repr(no_newer_than)]) for m in members]
        )

    async def _locate_in_one_call(
        self, reads: _ReadConnections, key: str, session_id: str, prune: float
    ) -> tuple[float, list[Located]] | None:
        """`_locate` on a standalone server: locate.lua reads the directory and the workers
        it names in one call, pruning as it goes (redis-py spends client CPU on every reply
        it parses)."""
        retired, *hits = await reads.evalsha(
            self._locate_script, [self._retired_key, key], [session_id, self._prefix, prune]
        )
        seen = [-float(retired)] if retired else []
        located = []
        for w, raw, parts in zip(hits[0::3], hits[1::3], hits[2::3], strict=True):
            seen.append(decode_residency(raw)[0])  # its last store there (see locate.lua)
            located.append(
                Located(parse_worker(w), raw, dict(zip(parts[0::2], parts[1::2], strict=True)))
            )
        if not seen:
            return None
        return max(seen), located

    async def session_blocks(
        self,
        session_id: str,
        *,
        pod: str | None,
        medium: str | None,
        limit: int,
        cursor: str | None,
    ) -> Page[Hash] | None:
        """Where the session is, with the parts naming its media (`_locate`, as
        `get_session`), then SUNION of its sets per worker, in Redis: two pipelined rounds
        (three on a cluster). Every page reads all its blocks: O(session blocks)."""
        located = await self._locate(session_id)
        if located is None:
            return None
        pipe = self._pipeline()
        unions = 0
        for w, raw, part_names in located[1]:
            if pod is not None and w.pod != pod:
                continue
            keys = self.worker_keys(w)
            sets = [
                keys.session(pid, session_id)
                for pid in decode_residency(raw)[1]
                if medium is None or _medium(part_names, pid) == medium
            ]
            if sets:
                # execute_command: the cluster pipeline refuses multi-key helpers, even
                # for keys of one slot, which these are.
                pipe.execute_command("SUNION", *sets)
                unions += 1
        found = await pipe.execute() if unions else []
        return page_hashes(_hashes(found), limit, cursor)

    async def worker_blocks(
        self, pod: str, *, dp_rank: int | None, medium: str | None, limit: int, cursor: str | None
    ) -> Page[Hash] | None:
        """The union of the pod's session and orphan sets (SUNION per worker, in Redis).

        Two pipelined rounds; every page reads all the pod's entries: O(pod entries).
        """
        workers = [
            w
            for w in await self._known()
            if w.pod == pod and (dp_rank is None or w.dp_rank == dp_rank)
        ]
        if not workers:
            return None
        pipe = self._pipeline()
        for w in workers:
            keys = self.worker_keys(w)
            pipe.exists(keys.meta)
            pipe.hgetall(keys.parts)
            pipe.hgetall(keys.res)
        out = await pipe.execute()
        if not any(out[0::3]):
            return None
        pipe = self._pipeline()
        unions = 0
        for w, parts, residencies in zip(workers, out[1::3], out[2::3], strict=True):
            keys = self.worker_keys(w)
            pids = {
                int(pid)
                for pid, raw in parts.items()
                if medium is None or decode_part(raw)[0] == medium
            }
            sets = [keys.orphans(pid) for pid in pids]
            for sid, raw in residencies.items():
                held = decode_residency(raw)[1]
                sets += (keys.session(pid, sid.decode()) for pid in held if pid in pids)
            for start in range(0, len(sets), MAX_ARGS):
                pipe.execute_command("SUNION", *sets[start : start + MAX_ARGS])
                unions += 1
        found = await pipe.execute() if unions else []
        return page_hashes(_hashes(found), limit, cursor)

    async def list_sessions(
        self,
        *,
        pod: str | None,
        limit: int,
        cursor: str | None,
        order: SessionOrder = "last_seen",
        prefix: str | None = None,
    ) -> Page[SessionSummary]:
        """Merge of the workers' seen sets (score -last_seen: ascending is the list order);
        `order="blocks"` is `_by_blocks`.

        Each round is two pipelined trips per node: the next sessions of every worker after
        the cursor, then those sessions' global last_seen (the max over workers) and block
        counts. A session is listed once, at its global place; a worker where it was seen
        earlier only proposes it. Rounds repeat, fetching twice as many, while the page is
        short. Cost: O((limit + sessions sharing the cursor's last_seen) x workers) per
        round; a pod filter or a prefix matching few sessions takes more rounds (the prefix
        is compared here, never sent to Redis), up to reading every seen set.
        """
        if order == "blocks":
            return await self._by_blocks(pod, limit, cursor, prefix)
        after = decode_session_cursor(cursor, order) if cursor is not None else None
        sources = await self._seen_sources(pod)
        found: dict[str, tuple[Place, SessionSummary]] = {}
        starts: list[Place | None] = [after] * len(sources)
        chunk = limit + 1
        while True:
            candidates, bound = await self._next_sessions(sources, starts, chunk)
            if prefix is not None:
                candidates = [sid for sid in candidates if sid.startswith(prefix)]
            if candidates:
                for place, summary in await self._summaries(sources, candidates):
                    if after is not None and place <= after:
                        continue  # listed on an earlier page, at its global place
                    if bound is not None and place > bound:
                        continue  # not every worker was read that far yet
                    if pod is None or summary.blocks:
                        found[summary.session_id] = (place, summary)
            if len(found) > limit or bound is None:
                break
            starts = [bound] * len(sources)
            chunk *= 2
        ordered = sorted(found.values(), key=lambda item: item[0])
        items = [s for _, s in ordered[:limit]]
        more = len(ordered) > limit
        return Page(
            items=items, next_cursor=encode_session_cursor(items[-1], order) if more else None
        )

    async def _by_blocks(
        self, pod: str | None, limit: int, cursor: str | None, prefix: str | None
    ) -> Page[SessionSummary]:
        """Most blocks first: HGETALL of the residencies of every worker asked (the pod's, or
        all), summed here, then the page's global last_seen (ZMSCORE per seen set). Seen sets
        are ordered by time, so no index gives this order: O(residencies) per page, read
        SCAN_CHUNK workers per round trip and decoded a worker at a time with a yield to the
        event loop between: a pipeline of every residency would hold Redis (and the routes
        waiting on it) for tens of milliseconds at 100,000 residencies, and decoded at once
        they would stall this process's requests."""
        if cursor is not None:
            decode_session_cursor(cursor, "blocks")  # a bad cursor fails before the reads
        wanted = None if prefix is None else prefix.encode()
        workers = [w for w in await self._known() if pod is None or w.pod == pod]
        held: dict[bytes, list[int]] = {}
        for start in range(0, len(workers), SCAN_CHUNK):
            pipe = self._pipeline()
            for w in workers[start : start + SCAN_CHUNK]:
                pipe.hgetall(self.worker_keys(w).res)
            for residencies in await pipe.execute():
                for sid, raw in residencies.items():
                    if wanted is None or sid.startswith(wanted):
                        blocks = sum(decode_residency(raw)[1].values())
                        if blocks:
                            held.setdefault(sid, []).append(blocks)
                await asyncio.sleep(0)
        snapshot = (
            SessionSummary(session_id=sid.decode(), blocks=sum(c), workers=len(c), last_seen=0.0)
            for sid, c in held.items()
        )
        page = page_sessions(snapshot, limit, cursor, "blocks")
        if not page.items:
            return page
        pipe = self._pipeline()
        ids = [s.session_id for s in page.items]
        for source in await self._seen_sources(pod):
            pipe.zmscore(source.seen, ids)
        scores = await pipe.execute()
        items = []
        for i, summary in enumerate(page.items):
            best = min((s[i] for s in scores if s[i] is not None), default=None)
            if best is not None:  # else expired meanwhile
                summary.last_seen = -best
                items.append(summary)
        return Page(items=items, next_cursor=page.next_cursor)

    async def _seen_sources(self, pod: str | None) -> list[Seen]:
        """Every record of sessions: the registered workers' and the retired one."""
        sources = [
            Seen(keys.seen, keys.res, pod is None or w.pod == pod, keys.meta)
            for w in await self._known()
            for keys in [self.worker_keys(w)]
        ]
        return [*sources, Seen(self._retired_key, None, False)]

    async def _next_sessions(
        self, sources: Sequence[Seen], starts: Sequence[Place | None], chunk: int
    ) -> tuple[list[str], Place | None]:
        """Up to `chunk` sessions of each source after its start, and the bound up to which
        every source's sessions are all known (None: all of them are)."""
        pipe = self._pipeline()
        for k, start in zip(sources, starts, strict=True):
            if start is None:
                pipe.zrange(k.seen, 0, chunk - 1, withscores=True)
            else:
                # Ties (one batch stamps many sessions with one time) come in id order,
                # which is the listing order; the cursor's own tie group is read whole.
                score = repr(start[0])
                pipe.zrange(k.seen, score, score, byscore=True, withscores=True)
                pipe.zrange(
                    k.seen, f"({score}", "+inf", byscore=True, offset=0, num=chunk, withscores=True
                )
        out = iter(await pipe.execute())
        fetched: list[Place] = []
        bound: Place | None = None
        for start in starts:
            if start is not None:
                fetched += (p for p in _places(next(out)) if p > start)
            rest = _places(next(out))
            if len(rest) == chunk and (bound is None or rest[-1] < bound):
                bound = rest[-1]
            fetched += rest
        sessions = {sid for score, sid in fetched if bound is None or (score, sid) <= bound}
        return sorted(sessions), bound

    async def _summaries(
        self, sources: Sequence[Seen], candidates: list[str]
    ) -> list[tuple[Place, SessionSummary]]:
        """Each candidate's global place (max last_seen over sources) and block counts."""
        counted = [k.res for k in sources if k.counted and k.res is not None]
        pipe = self._pipeline()
        for k in sources:
            pipe.zmscore(k.seen, candidates)
        for res in counted:
            pipe.hmget(res, candidates)
        out = await pipe.execute()
        scores, residencies = out[: len(sources)], out[len(sources) :]
        summaries = []
        for i, sid in enumerate(candidates):
            best = min((s[i] for s in scores if s[i] is not None), default=None)
            if best is None:
                continue  # expired meanwhile
            counts = [sum(decode_residency(r[i])[1].values()) for r in residencies if r[i]]
            summary = SessionSummary(
                session_id=sid,
                blocks=sum(counts),
                workers=sum(1 for c in counts if c),
                last_seen=-best,
            )
            summaries.append(((best, sid), summary))
        return summaries

    async def list_workers(self) -> list[WorkerView]:
        """HGETALL of each registered worker's meta hash, `LIST_CHUNK` workers per round
        trip; the states cache takes their states, unless another read updated it meanwhile.
        O(workers)."""
        started = time.monotonic()
        up_to = self._states.up_to
        workers = await self._known()
        reads: list[Command] = [
            (m, ("HGETALL", m), {}) for m in (self.worker_keys(w).meta for w in workers)
        ]
        views: list[WorkerView] = []
        async for part, metas in self._rounds(reads, LIST_CHUNK):
            # A meta gone (empty) was removed by another process since the registry was read.
            views += [_view(w, meta) for w, meta in zip(workers[part], metas, strict=True) if meta]
        if self._states.up_to == up_to:
            states = {WorkerKey(v.pod, v.dp_rank): v.status.state for v in views}
            self._states.keep(states, started)
        return views

    async def worker_models(self) -> Mapping[WorkerKey, str | None]:
        """Each registered worker's model, from a cache at most `registry_ttl` old, as the
        states are (`_cached`; and at once after this process wrote another model for a
        worker): a route restricted to a model then costs no read of every worker."""
        return await self._cached(self._models, self._models_refresh)

    def _model_written(self, worker: WorkerKey, model: str | None) -> None:
        """This process wrote the worker's model: the cache reads it again if it differs."""
        if self._models.values.get(worker, model) != model:
            self._models.expire()

    async def _meta_field(
        self, workers: Sequence[WorkerKey], name: str
    ) -> dict[WorkerKey, bytes | None]:
        """One field of each worker's meta, for the workers whose meta still exists (another
        process may have removed one since the registry was read): EXISTS and HGET per
        worker, `FIELD_CHUNK` workers a round trip."""
        reads: list[Command] = []
        for w in workers:
            meta = self.worker_keys(w).meta
            reads.append((meta, ("EXISTS", meta), {}))
            reads.append((meta, ("HGET", meta, name), {}))
        out = await self._batches(reads, 2 * FIELD_CHUNK)
        return {
            w: value
            for w, exists, value in zip(workers, out[0::2], out[1::2], strict=True)
            if exists
        }

    async def worker_losses(self) -> dict[WorkerKey, WorkerLosses]:
        """Each registered worker's loss sums (meta `LOSS_FIELDS`, kept by its writer): one
        HMGET per worker, `LIST_CHUNK` a round trip. A worker whose meta lacks them (written
        before they existed, and not since) is summed in Redis by losses.lua over its
        residencies, `LOSS_CHUNK` a round trip. For the metrics refresher, not requests."""
        workers = await self._known()
        metas = [self.worker_keys(w).meta for w in workers]
        reads: list[Command] = [(meta, ("HMGET", meta, *LOSS_FIELDS), {}) for meta in metas]
        out: dict[WorkerKey, WorkerLosses] = {}
        legacy: list[WorkerKey] = []
        async for part, replies in self._rounds(reads, LIST_CHUNK):
            for w, values in zip(workers[part], replies, strict=True):
                losses = decode_losses(values)
                if losses is None:
                    legacy.append(w)
                else:
                    out[w] = losses
        for start in range(0, len(legacy), LOSS_CHUNK):
            chunk = legacy[start : start + LOSS_CHUNK]
            calls: list[tuple[list[str], list[Arg]]] = [
                ([self.worker_keys(w).meta, self.worker_keys(w).res], []) for w in chunk
            ]
            sums = await self._scripted(self._losses_script, calls)
            for w, (exists, hurt, lost, tokens) in zip(chunk, sums, strict=True):
                if exists:  # else removed by another process since the registry was read
                    out[w] = WorkerLosses(
                        sessions_hurt=hurt, lost_blocks=lost, reprefill_tokens=tokens
                    )
        return out

    async def worker_states(self) -> Mapping[WorkerKey, WorkerState]:
        """The state in each registered worker's meta, from a cache at most `registry_ttl`
        old (`_cached`; and refreshed by list_workers): a session view or a route then costs
        no round trip for them. The same mapping while the states read are the same."""
        return await self._cached(self._states, self._states_refresh)

    async def _cached(self, cache: FieldCache[T], refresh: SharedCall) -> Mapping[WorkerKey, T]:
        """The cache's values of the registered workers, refreshed when `registry_ttl` has
        passed or a worker registered since (`_refresh_field`, shared by the callers in
        flight; with a `registry_ttl` of 0, every worker's value read by each caller)."""
        registry = await self._known_workers()
        if cache.due(time.monotonic(), self._registry_ttl) or not cache.covers(registry):
            read = functools.partial(self._read_field, cache)
            await self._due(refresh, read)
            registry = await self._known_workers()
            if not cache.covers(registry):  # registered after the shared read began
                await self._due(refresh, read)
                registry = await self._known_workers()
        return cache.registered(registry)

    async def _due(self, shared: SharedCall, read: Callable[[], Awaitable[None]]) -> None:
        """A cache's read, due: shared by the callers in flight while reads are cached
        (`registry_ttl` > 0), else each caller's own (fresh: none begun before it)."""
        await (shared() if self._registry_ttl > 0 else read())

    async def _refresh_field(self, cache: FieldCache[Any]) -> None:
        """The cache brought up to date: one call of states_since.lua answers the states
        counter and, if it moved, the log of which workers' status changed (`read_log`);
        their field is read again (EXISTS and HGET each), and that of workers registered
        since. Every worker's is read again when the log cannot tell them all (trimmed, too
        far behind, a writer that does not log, a counter that went back), and at least
        every `STATES_READ_SECONDS` (a writer that died between a status and its log entry).
        A worker the log names that this process does not know yet waits for its registry
        read; one whose meta is gone leaves it."""
        started = time.monotonic()
        if started - cache.read_at >= STATES_READ_SECONDS:
            return await self._read_field(cache)
        up_to = cache.up_to
        logged = await self._states_since(up_to)
        if logged.workers is None:
            return await self._read_field(cache)
        registry = await self._known_workers()
        named = (w for w in logged.workers if w in registry)
        todo = sorted({*named, *cache.missing(registry)})
        found = await self._meta_field(todo, cache.field) if todo else {}
        if cache.up_to != up_to:  # overtaken by another read (see `FieldCache.up_to`)
            return
        for w in todo:
            if w not in found:
                registry.discard(w)
        cache.patch(todo, found, started)
        cache.logged(logged)

    async def _read_field(self, cache: FieldCache[Any]) -> None:
        """Every registered worker's field read again, after the states counter and the log's
        newest entry (a change after them moves the counter again)."""
        started = time.monotonic()
        logged = await self._states_since(None)
        found = await self._meta_field(await self._known(), cache.field)
        cache.keep({w: cache.parse(value) for w, value in found.items()}, started)
        cache.logged(logged)
        cache.read_at = started

    async def _states_since(self, up_to: tuple[int, bytes | None] | None) -> Logged:
        """states_since.lua, read (`read_log`) for a cache up to (count, its log entry), or
        for a read of every worker (None)."""
        count, entry = up_to if up_to is not None else (None, None)
        args: list[Arg] = ["" if count is None else count, STATES_LOG_READ]
        call = ([self._states_key, self._states_log], args)
        (reply,) = await self._scripted(self._states_since_script, [call])
        return read_log(reply, count, entry)

    async def match_prefix(
        self, hashes: list[Hash], workers: list[WorkerKey] | None
    ) -> dict[WorkerKey, list[tuple[str, ...]]]:
        """prefix.lua over the workers that may hold the prompt's first block: those its
        block directory set names ("Redis: directories"), plus any chosen worker from before
        the directory (`_legacy`), within the chosen ones. On a standalone server one call
        (the script reads the set and prunes it); on a cluster ZRANGE of the set, then one
        call per candidate in one pipeline (one round trip per node), then the prune.

        The script walks the prompt's hashes in order with SISMEMBER on each part's
        entry-index bucket until the first one no part holds, and answers only for the
        workers holding the first. O(candidates x matched x parts), plus O(`workers`) when
        given.
        """
        registry = await self._known_workers()
        chosen: Container[WorkerKey] = (
            registry if workers is None else {w for w in workers if w in registry}
        )
        out: dict[WorkerKey, list[tuple[str, ...]]] = {}
        if not hashes or (workers is not None and not chosen):
            return out
        args: list[Arg] = []
        for h in hashes:
            args += (member(h), bucket(h))
        prune = time.time() - SAFE_SECONDS
        directory = block_key(self._prefix, member(hashes[0]))
        legacy = [w for w in await self._unmarked(registry) if w in chosen]
        if self._reads is not None:
            keys = [directory, *(self.worker_keys(w).parts for w in legacy)]
            reply = await self._reads.evalsha(
                self._prefix_script, keys, [self._prefix, prune, "1", *args]
            )
        else:
            reply = await self._prefix_on_cluster(directory, chosen, legacy, args, prune)
        for raw, matched in zip(reply[0::2], reply[1::2], strict=True):
            w = parse_worker(raw)
            if w in chosen and matched:
                out[w] = [tuple(sorted(m.decode() for m in held)) for held in matched]
        return out

    async def match_tokens(
        self, tokens_hashes: list[int], workers: list[WorkerKey]
    ) -> dict[WorkerKey, list[tuple[str, ...]]]:
        """walk.lua per worker (its edge hash), in one pipeline; then `match_prefix` once
        per distinct path, over the workers that walked it (usually one call: workers
        holding a prompt hold it under the same engine hashes)."""
        registry = await self._known_workers()
        chosen = [w for w in dict.fromkeys(workers) if w in registry]
        if not tokens_hashes or not chosen:
            return {}
        args: list[Arg] = [str(t) for t in tokens_hashes]
        walks = await self._scripted(
            self._walk_script, [([self.worker_keys(w).tokens], args) for w in chosen]
        )
        paths: dict[tuple[Hash, ...], list[WorkerKey]] = {}
        for w, found in zip(chosen, walks, strict=True):
            if found:
                paths.setdefault(tuple(map(hash_of, found)), []).append(w)
        out: dict[WorkerKey, list[tuple[str, ...]]] = {}
        for path, walked in paths.items():
            out.update(await self.match_prefix(list(path), walked))
        return out

    async def token_edges(self, worker: WorkerKey) -> dict[int, Edge]:
        raw = cast(dict[bytes, bytes], await self._client.hgetall(self.worker_keys(worker).tokens))
        return {h: key for key, h in (parse_edge(f, v) for f, v in raw.items())}

    async def _prefix_on_cluster(
        self,
        directory: str,
        chosen: Container[WorkerKey],
        legacy: list[WorkerKey],
        args: list[Arg],
        prune: float,
    ) -> list[Any]:
        """`match_prefix` on a cluster: the candidates from the set, then prefix.lua per
        candidate (its keys share its slot), then unhint.lua for the set's stale entries.
        The replies flattened as prefix.lua's (`worker, matched, ...`)."""
        named: list[tuple[bytes, float]] = (
            await self._batch(
                [(directory, ("ZRANGE", directory, 0, -1, "WITHSCORES"), WITH_SCORES)]
            )
        )[0]
        scores = {parse_worker(raw): score for raw, score in named}
        candidates = list(dict.fromkeys([*(w for w in scores if w in chosen), *legacy]))
        head: list[Arg] = [self._prefix, prune, "0"]
        calls = [([self.worker_keys(w).parts], head + args) for w in candidates]
        replies = await self._scripted(self._prefix_script, calls) if calls else []
        flat: list[Any] = []
        holding = set()
        for w, reply in zip(candidates, replies, strict=True):
            if reply:
                flat += reply
                holding.add(w)
        stale = [
            worker_member(w)
            for w, score in scores.items()
            if w not in holding and score < prune and w in chosen
        ]
        if stale:
            await self._prune(directory, stale, prune)
        return flat

    async def _unmarked(self, registry: KnownWorkers) -> tuple[WorkerKey, ...]:
        """Registered workers whose first blocks may be missing from the block directory
        (meta without `bdir`: written before it existed, and not cleared since). Marked
        workers are remembered; the others are asked again at most every `registry_ttl`.
        O(1) while the registry and the marks are unchanged (a fleet of marked workers)."""
        if registry.version != self._legacy_version:
            self._legacy = tuple(w for w in registry.ordered() if w not in self._block_marked)
            self._legacy_version = registry.version
        if self._legacy and time.monotonic() - self._legacy_at >= self._registry_ttl:
            await self._due(self._marks_refresh, self._read_block_marks)
        return self._legacy

    async def _read_block_marks(self) -> None:
        """Ask the unmarked workers for their marks again; remember the marked ones."""
        started = time.monotonic()
        unknown = self._legacy
        metas = [self.worker_keys(w).meta for w in unknown]
        marks = await self._batch([(m, ("HGET", m, BLOCK_DIRECTORY_MARK), {}) for m in metas])
        self._block_marked.update(w for w, mark in zip(unknown, marks, strict=True) if mark)
        self._legacy_at = started
        self._legacy = tuple(w for w in self._legacy if w not in self._block_marked)

    async def _scripted(
        self, script: Any, calls: Sequence[tuple[list[str], list[Arg]]]
    ) -> list[Any]:
        """EVALSHAs of `script` (KEYS, ARGV each) in one pipeline; again after loading the
        script if a node lacks it (restarted, or a failover). Other errors propagate."""
        for attempt in range(2):
            # EVALSHA, not the pipeline's evalsha helper (the cluster pipeline blocks it):
            # routed by its first key, as redis-py special-cases it.
            replies = await self._batch(
                [
                    (keys[0], ("EVALSHA", script.sha, len(keys), *keys, *args), {})
                    for keys, args in calls
                ],
                raise_on_error=False,
            )
            missing = any(isinstance(r, NoScriptError) for r in replies)
            if missing and not attempt:
                script.sha = await self._client.script_load(script.script)
                continue
            for r in replies:
                if isinstance(r, Exception):
                    raise r
            return replies
        raise AssertionError("unreachable")

    async def change_feed(self) -> FeedHub:
        """This process's hub, fed from the workers' feed streams by a pump started on the
        first call: from each stream's end at that moment (one pipelined XREVRANGE), so every
        change written after this returns reaches the hub. Raises if Redis is unreachable
        then (the next call tries again)."""
        if self._pump is None:
            async with self._pump_lock:
                if self._pump is None:
                    workers = await self._known(fresh=True)
                    feeds = [self.worker_keys(w).feed for w in workers]
                    ends = await stream_ends(self._client, feeds)
                    pump = FeedPump(
                        self._client,
                        self._hub,
                        self._known,
                        lambda w: self.worker_keys(w).feed,
                        dict(zip(workers, ends, strict=True)),
                    )
                    pump.start()
                    self._pump = pump
        return self._hub

    def _feed_written(self, worker: WorkerKey) -> None:
        """This process wrote the worker's feed stream (or may have): its pump reads it now."""
        pump = self._pump
        if pump is not None:
            pump.written(worker)

    async def _stop_feed(self) -> None:
        pump, self._pump = self._pump, None
        if pump is not None:
            await pump.stop()
