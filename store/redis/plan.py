"""The write program lua/apply.lua runs: KEYS in op order, then flat ops of plain writes.

Imports neither zmq, fastapi nor redis. The writer builds one Plan per write; the script only
checks the fence and version, then replays the ops, so no per-block logic runs in Redis.
Each op is `code, count, args...`: it takes the next KEYS entry and `count` args, or, for the
multi-key codes (DEL, SUNIONSTORE), the next `count` KEYS entries and no args. Two header
args per op, not four: every argument costs Redis a Lua string and the client a packing.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsi.store.redis.layout import WorkerKeys

Arg = str | int | float | bytes

MAX_ARGS = 4000
"""Args (or keys) per op: Redis' Lua cannot `unpack` more than 8000 values into one call."""

# Op codes, as apply.lua's CMD table maps them to commands (a whitelist, not free text).
SADD = "a"
SREM = "r"
HSET = "h"
HSETNX = "n"
HDEL = "H"
ZADD = "z"
ZREM = "Z"
LPUSH = "l"
LTRIM = "t"
DEL = "d"
SUNIONSTORE = "u"
XADD = "x"
STORE_INDEXED = "F"
"""SADD to the op's key, and each member into the entry index (apply.lua buckets it)."""
REMOVE_INDEXED = "E"
"""SREM from the op's key, and each member out of the entry index."""
REMOVE1_INDEXED = "S"
"""One SREM of one member per key, for `count` keys (the op's args are the members), and
each member out of the entry index."""
INDEX_ADD = "I"
"""Members into the entry index; no key of their own."""
INDEX_BASE = "B"
"""The op's key starts the entry-index bucket names the next F/E/S/I ops write (a part's)."""


class Plan:
    """KEYS (meta and version log first, for the guard) and ARGV ops for one apply.lua call."""

    __slots__ = ("_base", "keys", "ops")

    def __init__(self, keys: WorkerKeys) -> None:
        self.keys: list[str] = [keys.meta, keys.vlog]
        self.ops: list[Arg] = []
        self._base: str | None = None
        """The entry-index base the script will have when it reaches the end of `ops`."""

    def call(self, code: str, key: str, args: Sequence[Arg], lead: Sequence[Arg] = ()) -> None:
        """One command on one key; long arg lists split into several (each with `lead` first).

        Splits keep pairs together (MAX_ARGS is even), so HSET and ZADD stay well-formed.
        """
        if len(args) <= MAX_ARGS:
            self.keys.append(key)
            ops = self.ops
            ops.append(code)
            ops.append(len(lead) + len(args))
            if lead:
                ops += lead
            ops += args
            return
        for start in range(0, len(args), MAX_ARGS):
            self.call(code, key, args[start : start + MAX_ARGS], lead)

    def extend(self, other: Plan) -> None:
        """Append `other`'s commands (its KEYS after the guard's two): several writes of one
        worker, planned in order, become one apply.lua call that checks the guard once."""
        self.keys += other.keys[2:]
        self.ops += other.ops
        if other._base is not None:
            self._base = other._base

    def index(self, code: str, base: str, members: Sequence[Arg], key: str | None = None) -> None:
        """Entry-index changes of one part (`base`: `WorkerKeys.entry_base`), in op order:
        INDEX_ADD, or STORE_INDEXED / REMOVE_INDEXED, which also SADD `members` to / SREM
        them from `key`.

        apply.lua works out each member's bucket and writes every bucket once, at the end of
        the call (or before a DEL): the client sends no per-bucket keys or groups, and a
        member a session stores or loses is sent once, not twice.
        """
        self._use_base(base)
        for start in range(0, len(members), MAX_ARGS):
            chunk = members[start : start + MAX_ARGS]
            if key is not None:
                self.keys.append(key)
            self.ops.append(code)
            self.ops.append(len(chunk))
            self.ops += chunk

    def index_singles(self, base: str, keys: Sequence[str], members: Sequence[Arg]) -> None:
        """REMOVE1_INDEXED: one member out of each of `keys`, two args per key, not four,
        and out of the entry index of the part `base` names.

        apply.lua runs them one by one (no `unpack`), so any count fits in one op.
        """
        self._use_base(base)
        ops = self.ops
        ops.append(REMOVE1_INDEXED)
        ops.append(len(keys))
        ops += members
        self.keys += keys

    def _use_base(self, base: str) -> None:
        """The entry-index base the next ops write (INDEX_BASE, only when it changes)."""
        if base != self._base:
            self.keys.append(base)
            self.ops += (INDEX_BASE, 0)
            self._base = base

    def delete(self, keys: Sequence[str]) -> None:
        """DEL of many keys."""
        for start in range(0, len(keys), MAX_ARGS):
            self._many(DEL, keys[start : start + MAX_ARGS])

    def union_store(self, dest: str, sources: Sequence[str]) -> None:
        """dest := union of sources (SUNIONSTORE, folding long lists into dest step by step)."""
        self._many(SUNIONSTORE, [dest, *sources[:MAX_ARGS]])
        for start in range(MAX_ARGS, len(sources), MAX_ARGS):
            self._many(SUNIONSTORE, [dest, dest, *sources[start : start + MAX_ARGS]])

    def _many(self, code: str, keys: Sequence[str]) -> None:
        self.ops += (code, len(keys))
        self.keys += keys
