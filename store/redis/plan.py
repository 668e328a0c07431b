"""The write program lua/apply.lua runs: KEYS in op order, then flat ops of plain writes.

Imports neither zmq, fastapi nor redis. The writer builds one Plan per write; the script only
checks the fence and version, then replays the ops, so no per-block logic runs in Redis. The
transport (store/redis/transport.py) usually sends the same ops as plain commands of a
transaction guarded by guard.lua (`COMMANDS`: each code's command).
Each op is `code, count, args...`: it takes the next KEYS entry and `count` args, or, for the
multi-key codes (DEL, SUNIONSTORE), the next `count` KEYS entries and no args, or for
REMOVE1 the next `count` KEYS entries and `count` args, one each. Two header args per op,
not four: every argument costs Redis a Lua string and the client a packing.

The entry index (each part's bucket sets, store/README.md) is written here too, as plain
SADDs and SREMs of whole buckets: the plan keeps each member's last change per bucket and
writes every touched bucket once, when the call is sealed (`seal`, just before it is sent)
or before a DEL (which may delete buckets). A run of batches in one call thus writes each
bucket with one SREM and one SADD, whatever its batches store and evict (again after each
DEL, and in parts of MAX_ARGS members).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from kvsi.store.model import Hash
from kvsi.store.redis.layout import WorkerKeys, bucket, member_texts

Arg = str | int | float | bytes
Text = str | bytes
"""A block hash as a set member, in the text Redis reads (`layout.member_texts`)."""

MAX_ARGS: Final = 4000
"""Args (or keys) per op: Redis' Lua cannot `unpack` more than 8000 values into one call."""

# Op codes, as apply.lua's CMD table maps them to commands (a whitelist, not free text).
# Final, as the write path's other constants: compiled, each use of a plain module name is a
# lookup in the module's globals.
SADD: Final = "a"
SREM: Final = "r"
HSET: Final = "h"
HSETNX: Final = "n"
HDEL: Final = "H"
ZADD: Final = "z"
ZREM: Final = "Z"
LPUSH: Final = "l"
LTRIM: Final = "t"
DEL: Final = "d"
SUNIONSTORE: Final = "u"
XADD: Final = "x"
EXPIRE: Final = "e"
REMOVE1: Final = "S"
"""One SREM of one member per key, for `count` keys (the op's args are the members)."""

COMMANDS: Final = {
    SADD: "SADD",
    SREM: "SREM",
    HSET: "HSET",
    HSETNX: "HSETNX",
    HDEL: "HDEL",
    ZADD: "ZADD",
    ZREM: "ZREM",
    LPUSH: "LPUSH",
    LTRIM: "LTRIM",
    DEL: "DEL",
    SUNIONSTORE: "SUNIONSTORE",
    XADD: "XADD",
    EXPIRE: "EXPIRE",
}
"""The command of each code but REMOVE1 (apply.lua's CMD table; a transaction's commands)."""


class _Buckets:
    """One part's entry-index changes not yet written: per bucket, each member's last
    change (True: in, False: out), kept per bucket so that sealing writes each as it is."""

    __slots__ = ("keys", "marks")

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.marks: list[dict[Text, bool] | None] = [None] * len(keys)


class Plan:
    """KEYS (meta and version log first, for the guard) and ARGV ops for one apply.lua call."""

    __slots__ = ("_marks", "keys", "ops")

    def __init__(self, keys: WorkerKeys) -> None:
        self.keys: list[str] = [keys.meta, keys.vlog]
        self.ops: list[Arg] = []
        self._marks: dict[str, _Buckets] = {}
        """Per part's entry index (named by its first bucket's key), each member's last
        change not yet written."""

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

    def index(
        self, entry_keys: list[str], hashes: list[Hash], texts: list[Text], *, into: bool
    ) -> None:
        """`hashes` (as `texts`, their `member_texts`) into (or out of) the entry index whose
        bucket keys are `entry_keys` (`RedisPart.entry_keys`): written per bucket when the
        call is sealed."""
        buckets = self._marks.get(entry_keys[0])
        if buckets is None:
            buckets = self._marks[entry_keys[0]] = _Buckets(entry_keys)
        marks = buckets.marks
        for i, text in enumerate(texts):
            b = bucket(hashes[i])
            members = marks[b]
            if members is None:
                members = marks[b] = {}
            members[text] = into

    def set_indexed(
        self, key: str, entry_keys: list[str], hashes: list[Hash], *, into: bool
    ) -> None:
        """`hashes` into (SADD) or out of (SREM) the set `key` and, the same way, the entry
        index whose bucket keys are `entry_keys`: the orphan and holder sets' changes,
        indexed."""
        texts = member_texts(hashes)
        self.call(SADD if into else SREM, key, texts)
        self.index(entry_keys, hashes, texts, into=into)

    def remove1(self, keys: Sequence[str], hashes: list[Hash], entry_keys: list[str]) -> None:
        """REMOVE1: one of `hashes` out of each of `keys`, two args per key, not four
        (apply.lua runs them one by one, no `unpack`: any count fits in one op), and all of
        them out of the entry index whose bucket keys are `entry_keys`."""
        texts = member_texts(hashes)
        ops = self.ops
        ops.append(REMOVE1)
        ops.append(len(keys))
        ops += texts
        self.keys += keys
        self.index(entry_keys, hashes, texts, into=False)

    def seal(self) -> None:
        """Write the entry-index changes still held: the plan is about to be sent."""
        self._write_marks()

    def _write_marks(self) -> None:
        """Each touched bucket's members out, then in: one SREM and one SADD at most."""
        for buckets in self._marks.values():
            keys = buckets.keys
            for b, members in enumerate(buckets.marks):
                if members is None:
                    continue
                out: list[Arg] = []
                added: list[Arg] = []
                for text, into in members.items():
                    (added if into else out).append(text)
                if out:
                    self.call(SREM, keys[b], out)
                if added:
                    self.call(SADD, keys[b], added)
        self._marks = {}

    def delete(self, keys: Sequence[str]) -> None:
        """DEL of many keys (after the entry-index changes planned before it)."""
        self._write_marks()
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
