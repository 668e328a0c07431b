"""The writer's side of the directories (store/README.md "Redis: directories"): what a
worker's writer asserts before its writes, keeps up in the janitor's passes, and takes out
when it drops a residency. The rules are store/directory.py's; this module does the I/O.

Imports neither zmq nor fastapi. Readers prune the sets themselves (store/redis/reads.py).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, NamedTuple, cast

from redis.commands.core import AsyncScript

from kvsi.store.directory import (
    BLOCK_DIRECTORY_MARK,
    DIRECTORY_DONE_AT,
    DIRECTORY_MARK,
    DIRECTORY_TTL,
    SAFE_SECONDS,
    block_key,
    firsts_to_assert,
    hint_commands,
    hint_key,
    sessions_to_assert,
)
from kvsi.store.model import Batch, Hash, WorkerKey
from kvsi.store.redis.layout import WorkerKeys, hash_of, member, members, worker_member
from kvsi.store.redis.mirror import Mirror
from kvsi.store.redis.node_reads import Command
from kvsi.store.redis.plan import EXPIRE, SADD, ZADD, Arg, Plan

Scripted = Callable[[AsyncScript, Sequence[tuple[list[str], list[Arg]]]], Awaitable[list[Any]]]
Batched = Callable[[Sequence[Command], int], Awaitable[list[Any]]]

ASSERT_CHUNK = 512
"""Assert commands per round trip: a writer loading a worker from before the directory
asserts its every residency at once, and a round's replies hold the event loop (and each
node) while they are read."""


class Due(NamedTuple):
    """What a write needed asserted: sessions and first blocks."""

    sessions: list[str]
    firsts: list[Hash]


class Asserted:
    """One writer's asserts for one worker: when it last asserted each session and each
    first block it holds (the janitor's upkeep walks the first blocks)."""

    __slots__ = ("firsts", "key", "member", "sessions")

    def __init__(self, keys: WorkerKeys) -> None:
        self.key = keys
        self.member = worker_member(keys.worker)
        self.sessions: dict[str, float] = {}
        self.firsts: dict[Hash, float] = {}


class Directories:
    """The directory writes of one store's writers, over its client."""

    def __init__(
        self,
        client: Any,
        prefix: str,
        scripted: Scripted,
        unhint: AsyncScript,
        mark: AsyncScript,
        batches: Batched,
        *,
        inline: bool,
    ) -> None:
        """`batches`: the store's commands in one round trip per node, a chunk of them at a
        time (`RedisReader._batches`). `inline`: a standalone server (the asserts ride in the
        writes' own calls)."""
        self._client = client
        self._batches = batches
        self._inline = inline
        self._prefix = prefix
        self._scripted = scripted
        self._unhint = unhint
        self._mark = mark
        self._complete: set[WorkerKey] = set()
        """Workers whose session entries are known complete (`complete_others`)."""

    def _pipeline(self) -> Any:
        return self._client.pipeline(transaction=False)

    # -- around a write -----------------------------------------------------------------------

    async def before(
        self,
        state: Asserted,
        mirror: Mirror,
        batches: Sequence[Batch],
        now: float,
        *,
        restarted: bool = False,
    ) -> Due:
        """What the batches need asserted (`sessions_to_assert`, `firsts_to_assert`). On a
        cluster it is written here, before the batches, in one round trip per node (only
        when something is due); on a standalone server it rides in the batches' own call
        (`inline`)."""
        refresh = now - DIRECTORY_TTL / 2
        due = Due(
            sessions_to_assert(batches, mirror.index.residencies, state.sessions, refresh),
            firsts_to_assert(
                batches, mirror.index.holds, state.firsts, refresh, restarted=restarted
            ),
        )
        if not self._inline:
            await self.write(state, due, now)
        return due

    def inline(self, plan: Plan, state: Asserted, due: Due, now: float) -> None:
        """On a standalone server, the asserts as ops of the write's own apply.lua call:
        written atomically with it, or not at all (no slots to keep apart there)."""
        if not self._inline:
            return
        ttl = int(DIRECTORY_TTL)
        keys, marked = self._sets(due)
        for key in keys:
            plan.call(ZADD, key, [now, state.member])
            plan.call(EXPIRE, key, [ttl])
        if marked:
            plan.call(SADD, state.key.firsts, marked)

    def applied(self, state: Asserted, due: Due, now: float) -> None:
        """The write landed: its inline asserts with it."""
        if self._inline:
            self._remember(state, due, now)

    async def after(self, state: Asserted, due: Due, asserted_at: float) -> None:
        """A write that took longer than half the safe age may have let a reader prune what
        was asserted for it before it (on a cluster): assert it again, now it is written."""
        now = time.time()
        if not self._inline and now - asserted_at > SAFE_SECONDS / 2:
            await self.write(state, due, now)

    async def write(self, state: Asserted, due: Due, now: float) -> None:
        """ZADD + EXPIRE of the worker in each due set, the first blocks in its `firsts` set
        (none when nothing is due), in one round trip per node (`ASSERT_CHUNK` commands
        each); remembered. Each is safe to send again (`_batches` may, after any failure)."""
        if not due.sessions and not due.firsts:
            return
        keys, marked = self._sets(due)
        commands: list[Command] = [
            (key, words, {}) for key, words in hint_commands(keys, state.member, now)
        ]
        if marked:
            commands.append((state.key.firsts, ("SADD", state.key.firsts, *marked), {}))
        await self._batches(commands, ASSERT_CHUNK)
        self._remember(state, due, now)

    def _sets(self, due: Due) -> tuple[list[str], list[int | bytes]]:
        """The directory sets `due` names (sessions', then first blocks'), and the first
        blocks as members."""
        marked = members(due.firsts)
        keys = [hint_key(self._prefix, sid) for sid in due.sessions]
        keys += [block_key(self._prefix, m) for m in marked]
        return keys, marked

    @staticmethod
    def _remember(state: Asserted, due: Due, now: float) -> None:
        for sid in due.sessions:
            state.sessions[sid] = now
        for h in due.firsts:
            state.firsts[h] = now

    # -- a writer's load, marks and upkeep ----------------------------------------------------

    async def loaded(
        self, state: Asserted, mirror: Mirror, meta: dict[bytes, bytes], firsts: set[bytes]
    ) -> None:
        """After a writer loaded the worker: its first blocks asserted again (those no
        longer held dropped from its `firsts` set), and, for a worker from before the
        directory (meta without `dir`), every residency asserted and the mark set."""
        known = [hash_of(m) for m in firsts]
        gone = mirror.index.missing(known)
        state.firsts = {}
        sessions = [] if DIRECTORY_MARK.encode() in meta else list(mirror.index.residencies)
        await self.write(state, Due(sessions, [h for h in known if h not in gone]), time.time())
        if gone:
            await self._client.srem(state.key.firsts, *members(gone))
        if DIRECTORY_MARK.encode() not in meta:
            await self._set(state.key, DIRECTORY_MARK, 1)

    def marks(self, pipe: Any, keys: WorkerKeys) -> None:
        """Queue both marks on a worker whose every entry its writer saw stored (a new
        worker): its directory entries are complete from the start."""
        pipe.hset(keys.meta, mapping={DIRECTORY_MARK: 1, BLOCK_DIRECTORY_MARK: 1})

    async def cleared(self, keys: WorkerKeys) -> None:
        """A clear of the worker emptied it: every first block it holds from now on is
        asserted, so its block entries are complete (`bdir`)."""
        await self._set(keys, BLOCK_DIRECTORY_MARK, 1)

    async def _set(self, keys: WorkerKeys, field: str, value: Arg) -> None:
        """A meta field of a worker that exists (mark.lua: never a meta left behind)."""
        await self._scripted(self._mark, [([keys.meta], [field, value])])

    async def upkeep(self, state: Asserted, mirror: Mirror, now: float) -> None:
        """The janitor's pass over a worker this process writes: first blocks it no longer
        holds leave its `firsts` set (their entries are pruned by reads or expire), those
        asserted half a TTL ago are asserted again (a block a prompt keeps hitting is never
        stored again). O(its first blocks)."""
        refresh = now - DIRECTORY_TTL / 2
        gone = mirror.index.missing(state.firsts)
        for h in gone:
            del state.firsts[h]
        if gone:
            await self._client.srem(state.key.firsts, *members(gone))
        old = [h for h, at in state.firsts.items() if at < refresh]
        await self.write(state, Due([], old), now)

    async def dropped(
        self, worker_member: str, sessions: list[str], firsts: Iterable[bytes], since: float
    ) -> None:
        """Take the worker out of the sets of the sessions whose residency it dropped at
        `since` (expiry, removal) and of the first blocks (`firsts`, set members) it no
        longer holds, unless asserted again after (unhint.lua), one pipeline."""
        prefix = self._prefix
        keys = [hint_key(prefix, sid) for sid in sessions]
        keys += [block_key(prefix, member(hash_of(m))) for m in firsts]
        if keys:
            args: list[Arg] = [worker_member, repr(since)]
            await self._scripted(self._unhint, [([key], args) for key in keys])

    async def complete_others(
        self, workers: Sequence[WorkerKey], keys_of: Callable[[WorkerKey], WorkerKeys]
    ) -> None:
        """Session entries for the residencies of workers whose writer did not make them:
        workers written before the directory existed and not loaded by a writer since, or
        written by an older kvsi during an upgrade. Their meta has no `dir` mark; each is
        done again only when its version moved since (`dirv`). O(workers) once per process,
        then O(such workers + their residencies) a pass."""
        todo = [w for w in workers if w not in self._complete]
        if not todo:
            return
        pipe = self._pipeline()
        for worker in todo:
            pipe.hmget(keys_of(worker).meta, [DIRECTORY_MARK, DIRECTORY_DONE_AT, "ver"])
        for worker, (mark, done_at, ver) in zip(todo, await pipe.execute(), strict=True):
            if mark is not None:
                self._complete.add(worker)
            elif ver is not None and ver != done_at:
                keys = keys_of(worker)
                sessions = cast(list[bytes], await self._client.hkeys(keys.res))
                state = Asserted(keys)
                await self.write(state, Due([s.decode() for s in sessions], []), time.time())
                await self._set(keys, DIRECTORY_DONE_AT, ver)

    def forget(self, worker: WorkerKey) -> None:
        self._complete.discard(worker)
