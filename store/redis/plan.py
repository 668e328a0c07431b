"""The write program lua/apply.lua runs: KEYS in op order, then flat ops of plain writes.

Imports neither zmq, fastapi nor redis. The writer builds one Plan per write; the script only
checks the fence and version, then replays the ops, so no per-block logic runs in Redis.
Each op is `code, count, args...`: it takes the next KEYS entry and `count` args, or, for the
multi-key codes (DEL, SUNIONSTORE), the next `count` KEYS entries and no args, or for
REMOVE1 the next `count` KEYS entries and `count` args, one each. Two header args per op,
not four: every argument costs Redis a Lua string and the client a packing.

The entry index (each part's bucket sets, store/README.md) is written here too, as plain
SADDs and SREMs of whole buckets: the plan keeps each member's last change per part and
writes every touched bucket once, when the call is sealed (`seal`, just before it is sent)
or before a DEL (which may delete buckets). A run of batches in one call thus writes each
bucket with one SREM and one SADD, whatever its batches store and evict (again after each
DEL, and in parts of MAX_ARGS members).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvsi.store.redis.layout import WorkerKeys, bucket

Arg = str | int | float | bytes
Member = int | bytes
"""A block hash as a set member (`layout.member`)."""

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
REMOVE1 = "S"
"""One SREM of one member per key, for `count` keys (the op's args are the members)."""


class Plan:
    """KEYS (meta and version log first, for the guard) and ARGV ops for one apply.lua call."""

    __slots__ = ("_deletes", "_marks", "keys", "ops")

    def __init__(self, keys: WorkerKeys) -> None:
        self.keys: list[str] = [keys.meta, keys.vlog]
        self.ops: list[Arg] = []
        self._marks: dict[str, dict[Member, bool]] = {}
        """Per part's entry base, each member's last change not yet written: in or out."""
        self._deletes = False
        """Whether the ops hold a DEL (before which the marks of a plan ahead are written)."""

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
        worker, planned in order, become one apply.lua call that checks the guard once. The
        entry-index changes of both are written together, unless `other` deletes."""
        if other._deletes:
            self._write_marks()
            self._deletes = True
        self.keys += other.keys[2:]
        self.ops += other.ops
        for base, changes in other._marks.items():
            marks = self._marks.get(base)
            if marks is None:
                self._marks[base] = dict(changes)
            else:
                marks.update(changes)

    def index(self, base: str, members: Sequence[Member], *, into: bool) -> None:
        """`members` into (or out of) the entry index of the part `base` names
        (`WorkerKeys.entry_base`): written per bucket when the call is sealed."""
        marks = self._marks.get(base)
        if marks is None:
            marks = self._marks[base] = {}
        for m in members:
            marks[m] = into

    def set_indexed(self, key: str, base: str, members: Sequence[Member], *, into: bool) -> None:
        """`members` into (SADD) or out of (SREM) the set `key` and, the same way, the entry
        index of the part `base` names: the orphan and holder sets' changes, indexed."""
        self.call(SADD if into else SREM, key, members)
        self.index(base, members, into=into)

    def remove1(self, keys: Sequence[str], members: Sequence[Arg]) -> None:
        """REMOVE1: one member out of each of `keys`, two args per key, not four (apply.lua
        runs them one by one, no `unpack`: any count fits in one op)."""
        ops = self.ops
        ops.append(REMOVE1)
        ops.append(len(keys))
        ops += members
        self.keys += keys

    def seal(self) -> None:
        """Write the entry-index changes still held: the plan is about to be sent."""
        self._write_marks()

    def _write_marks(self) -> None:
        """Each touched bucket's members out, then in: one SREM and one SADD at most."""
        for base, marks in self._marks.items():
            buckets: dict[int, tuple[list[Arg], list[Arg]]] = {}
            for m, into in marks.items():
                b = bucket(m)  # a member's bucket is its hash's (layout.member)
                group = buckets.get(b)
                if group is None:
                    group = buckets[b] = ([], [])
                (group[1] if into else group[0]).append(m)
            for b, (out, added) in buckets.items():
                key = f"{base}{b}"
                if out:
                    self.call(SREM, key, out)
                if added:
                    self.call(SADD, key, added)
        self._marks = {}

    def delete(self, keys: Sequence[str]) -> None:
        """DEL of many keys (after the entry-index changes planned before it)."""
        self._write_marks()
        self._deletes = True
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
