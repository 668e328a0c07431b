"""The directories: which workers may hold a residency of a session, and which may hold a
prompt's first block, so that a session lookup or a prefix match touches those workers and
not the fleet (store/README.md "Redis: directories").

The rule and the names, without I/O (and without the Redis client: the settings check
`MAX_IDLE_SECONDS`); store/redis/ reads and writes the sets. One sorted set per session,
`P:dir:<session id>`, of `<pod>/<rank>` members scored with the wall time their writer last
asserted them. The rule: a worker holding a residency of the session is in its set; the set
may hold more (a write that never landed, a residency dropped since), which readers prune
once the entry is older than `SAFE_SECONDS` and the worker holds no residency. Writers
assert before the write that needs it; nothing else adds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Final, TypeVar, cast

from kvsi.store.model import CLEARED, STORED, Batch, EntriesStored, Hash
from kvsi.store.records import Residency

R = TypeVar("R", bound=Residency)

_NEVER: Final = -math.inf
"""When an entry never asserted was: before any time. Dicts, not Mappings, in the rules'
signatures: compiled (setup.py `NATIVE`), a Mapping's `get` is a method call by name."""

DIRECTORY_TTL = 259_200.0
"""Seconds a session's set outlives its last assert (Redis EXPIRE): what bounds the sets of
sessions nobody reads again. A writer asserts again on the session's first store after half
of it; a residency stored no more is dropped by expiry (`MAX_IDLE_SECONDS`) well before."""

MAX_IDLE_SECONDS = 86_400.0
"""The longest `session_idle_seconds` on Redis: a residency last asserted at A and stored
until A + TTL/2 expires by A + TTL/2 + idle plus the janitor's delay, inside the TTL."""

SAFE_SECONDS = 120.0
"""An entry younger than this is never pruned: its writer may still be writing the
residency it announced. A writer whose write took longer than half of it asserts again
after the write (so a prune during a stall is repaired at once). Clocks of the processes
must agree within half of it."""

DIRECTORY_MARK = "dir"
"""Meta field of a worker whose directory entries its writers keep complete: set when a
writer registers the worker or loads it (asserting every residency it holds)."""

DIRECTORY_DONE_AT = "dirv"
"""Meta field: the worker's version (`ver`) when a janitor last asserted its residencies,
for a worker without `DIRECTORY_MARK` (`RedisStore._complete_directories`)."""


BLOCK_DIRECTORY_MARK = "bdir"
"""Meta field of a worker whose first blocks are all in the block directory: set when a writer
registers the worker or clears it (every first block it holds after that was asserted).
A worker without it is read by every prefix match, as before the directory."""


def block_key(prefix: str, member: int | bytes) -> str:
    """A first block's directory set, by its set member (`layout.member`): its own slot."""
    text = "x" + member.hex() if isinstance(member, bytes) else str(member)
    return f"{prefix}:blk:{text}"


def hint_key(prefix: str, session_id: str) -> str:
    """The session's directory set: its own slot (only a `{...}` in the id moves it)."""
    return f"{prefix}:dir:{session_id}"


def hint_commands(
    keys: Iterable[str], member: str, now: float
) -> list[tuple[str, tuple[str | int | float, ...]]]:
    """The commands of an assert, each as (its key, its words): per directory set, ZADD of
    the worker's `member` at `now` and the set's EXPIRE."""
    ttl = int(DIRECTORY_TTL)
    commands: list[tuple[str, tuple[str | int | float, ...]]] = []
    for key in keys:
        commands.append((key, ("ZADD", key, now, member)))
        commands.append((key, ("EXPIRE", key, ttl)))
    return commands


def firsts_to_assert(
    batches: Iterable[Batch],
    held: Callable[[Hash], bool],
    asserted: dict[Hash, float],
    refresh_before: float,
    *,
    restarted: bool = False,
) -> list[Hash]:
    """The first blocks a writer must assert before writing `batches` (the rule, no I/O): the
    first hash of each store that starts a prompt (no parent: vLLM's position 0, the block a
    prefix match starts from) which the worker does not hold before them, or whose last
    assert by this writer is unknown or older than `refresh_before`. After a clear (the
    batch `restarted` the engine, or a `WorkerCleared` came first) every such store counts:
    its block was dropped before it was stored again."""
    due: dict[Hash, None] = {}
    cleared = restarted
    for batch in batches:
        for event in batch.events:
            kind = event.kind  # not isinstance: see EntriesStored.kind
            if kind == CLEARED:
                cleared = True
            if kind != STORED:
                continue
            stored = cast(EntriesStored, event)
            if stored.parent_block_hash is not None or not stored.block_hashes:
                continue
            first = stored.block_hashes[0]
            if first in due:
                continue
            stale = asserted.get(first, _NEVER) < refresh_before
            if cleared or stale or not held(first):
                due[first] = None
    return list(due)


def sessions_to_assert(
    batches: Iterable[Batch],
    residencies: dict[str, R],
    asserted: dict[str, float],
    refresh_before: float,
) -> list[str]:
    """The sessions a writer must assert before writing `batches` (the rule, no I/O): each
    session stored whose residency is absent or holds nothing before them (Redis may have
    none: a reader may have pruned the entry, another process dropped an empty residency),
    or whose last assert by this writer is unknown or older than `refresh_before` (the set's
    TTL)."""
    due: dict[str, None] = {}
    for batch in batches:
        for event in batch.events:
            if event.kind != STORED:  # not isinstance: see EntriesStored.kind
                continue
            sid = cast(EntriesStored, event).session_id
            if sid is None or sid in due:
                continue
            res = residencies.get(sid)
            if res is None or not res.total or asserted.get(sid, _NEVER) < refresh_before:
                due[sid] = None
    return list(due)
