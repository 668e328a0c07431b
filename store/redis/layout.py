"""Where the Redis store keeps what: key names, set members and the values it parses back.

Imports neither zmq, fastapi nor redis: pure naming, shared by the writer, the reader and tests,
and the index core's part and residency with the names and values of their keys (`RedisPart`,
`MirrorResidency`). The layout itself is described in store/README.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple

from kvsi.store.model import U64_MASK, Hash, WorkerKey, WorkerLosses
from kvsi.store.records import Part, Residency
from kvsi.store.tokens import Edge

DEFAULT_PREFIX = "kvsi"

DIGEST_MARK = b"\x00"
"""Leads a byte-digest member, so no digest ever reads as an integer member (and back)."""

_SIGN: Final = 1 << 63
_WRAP: Final = 1 << 64


def as_text(value: object) -> str:
    """`str(value)` of a value typed as an object: compiled, `str(n)` of an `n` known to be an
    int unboxes it and boxes it again first (a set member is a long int half the time),
    and calling `str` as an object takes the type's slow call."""
    return str(value)


META_FENCE = ("seq", "epoch", "last_ts")
"""Meta hash fields of the fence, in `store.model.Fence` order."""

BUCKETS = 128
"""Buckets of a part's entry index (`P:{W}:e:<pid>:<bucket>`): a 50,000-entry part puts
~390 (max ~450) members in each, under Redis' default `set-max-intset-entries` (512), so every
bucket of u64 hashes stays a compact intset (8 bytes a member). A power of two."""

_BUCKET_MASK: Final = BUCKETS - 1


def bucket(h: Hash) -> int:
    """The entry-index bucket of a hash: its low bits (u64), or its last byte's (digest)."""
    if isinstance(h, bytes):
        return h[-1] & _BUCKET_MASK if h else 0
    return h & _BUCKET_MASK


def member(h: Hash) -> int | bytes:
    """A block hash as a set member: u64 as signed i64 (so Redis keeps an intset), digests marked.

    Hashes arrive canonical (the ingest decoder applies `store.model.canonical_hash`).
    """
    if isinstance(h, bytes):
        return DIGEST_MARK + h
    return h - _WRAP if h >= _SIGN else h


def members(hashes: Iterable[Hash]) -> list[int | bytes]:
    """`member` of each hash; the all-int list (the common case) in one comprehension."""
    try:
        return [h - _WRAP if h >= _SIGN else h for h in hashes]  # type: ignore[operator]
    except TypeError:  # a digest among them: bytes do not compare with ints
        return [member(h) for h in hashes]


def member_texts(hashes: Sequence[Hash]) -> list[str | bytes]:
    """`member` of each hash as the text Redis reads it in (a command's arguments travel as
    text): made once for both writes that name a member, its set's and its entry-index
    bucket's, where packing an int argument formats it anew each time."""
    try:
        return [as_text(h - _WRAP) if h >= _SIGN else as_text(h) for h in hashes]  # type: ignore[operator]
    except TypeError:  # a digest among them: bytes do not compare with ints
        return [m if isinstance(m, bytes) else as_text(m) for m in map(member, hashes)]


def hash_of(raw: bytes) -> Hash:
    """Inverse of `member` for what Redis returns: canonical (unsigned) ints, bare digests."""
    if raw[:1] == DIGEST_MARK:
        return raw[1:]
    return int(raw) & U64_MASK


def check_prefix(prefix: str) -> str:
    """The prefix, if usable: braces would move the hash tag off the worker's name."""
    if not prefix or "{" in prefix or "}" in prefix:
        raise ValueError(f"key prefix {prefix!r} must be non-empty and contain no '{{' or '}}'")
    return prefix


def registry_key(prefix: str) -> str:
    """The set of known workers (`pod/rank` members); its own slot, one small key."""
    return f"{prefix}:workers"


def states_key(prefix: str) -> str:
    """A counter a writer increments after it changed a worker's status (status.lua said so),
    with an entry in the states log (`states_log_key`): a reader reads states and models
    again only when it moved, and then only those of the workers the log names."""
    return f"{prefix}:states"


def states_log_key(prefix: str) -> str:
    """A stream of which worker each move of the states counter was for (`n`, `w` fields),
    in the counter's slot (its name is the hash tag): a reader whose count is a few behind
    reads those workers' states again, not every worker's. Bounded (XADD MAXLEN ~)."""
    return f"{{{states_key(prefix)}}}:log"


def retired_key(prefix: str) -> str:
    """Sessions seen on removed workers (-last_seen, as a worker's seen set): a session
    outlives the workers it was seen on until it expires, as in the memory store."""
    return f"{prefix}:retired"


def worker_member(worker: WorkerKey) -> str:
    return f"{worker.pod}/{worker.dp_rank}"


def parse_worker(raw: bytes) -> WorkerKey:
    pod, _, rank = raw.decode().rpartition("/")
    return WorkerKey(pod, int(rank))


class WorkerKeys:
    """Every key of one worker: `<prefix>:{<pod>/<rank>}:<name>`, one hash tag, one slot.

    Only the first `{...}` of a key is its hash tag, so the prefix stays outside the braces
    and a session id (which may hold braces) only ever comes after them.
    """

    __slots__ = (
        "base",
        "feed",
        "firsts",
        "meta",
        "parts",
        "res",
        "seen",
        "tokens",
        "vlog",
        "worker",
    )

    def __init__(self, prefix: str, worker: WorkerKey) -> None:
        if "{" in worker.pod or "}" in worker.pod:
            raise ValueError(f"pod name {worker.pod!r} must not contain '{{' or '}}'")
        self.worker = worker
        self.base = f"{prefix}:{{{worker.pod}/{worker.dp_rank}}}:"
        self.meta = self.base + "meta"
        self.vlog = self.base + "vlog"
        self.parts = self.base + "parts"
        self.seen = self.base + "seen"
        self.res = self.base + "res"
        self.feed = self.base + "feed"
        self.firsts = self.base + "f"
        """First blocks its writers asserted in the block directory (a superset of those it
        holds: kept up by the writer's upkeep, read back by a writer's load)."""
        self.tokens = self.base + "tk"
        """Dynamo's edges (store/tokens.py): `edge_field` -> the block's member."""

    def session(self, pid: int, session_id: str) -> str:
        """The session's entries in one part of the worker (medium, group)."""
        return f"{self.base}s:{pid}:{session_id}"

    def orphans(self, pid: int) -> str:
        """Entries of the part that no session holds (stored without a session_id)."""
        return f"{self.base}o:{pid}"

    def entries(self, pid: int) -> list[str]:
        """The part's entry index: bucket key per `bucket(h)`, every hash the part holds."""
        head = self.entry_base(pid)
        return [f"{head}{b}" for b in range(BUCKETS)]

    def entry_base(self, pid: int) -> str:
        """What the part's entry-index bucket keys start with (then the bucket number)."""
        return f"{self.base}e:{pid}:"

    def unconfirmed(self, pid: int) -> str:
        """Entries of the part held over an unrepaired gap, not stored again since."""
        return f"{self.base}u:{pid}"


def edge_field(edge: Edge) -> str:
    """`<parent's member, or nothing at a prompt's start>:<tokens hash>`: walk.lua builds
    the same from the member it found and the next tokens hash."""
    parent, tokens = edge
    return f"{'' if parent is None else _signed(parent)}:{tokens}"


def _signed(h: int) -> int:
    return h - _WRAP if h >= _SIGN else h


def parse_edge(field: bytes, value: bytes) -> tuple[Edge, int]:
    """Inverse of `edge_field`, with the block its value names (ints only)."""
    parent, _, tokens = field.decode().partition(":")
    block = hash_of(value)
    if not isinstance(block, int):
        raise ValueError(f"edge {field!r} names a digest")
    return (None if not parent else int(parent) & U64_MASK, int(tokens)), block


def encode_part(medium: str, group: int) -> str:
    return f"{group}|{medium}"


def decode_part(raw: bytes) -> tuple[str, int]:
    """(medium, group) of a parts-hash value; the medium may itself contain '|'."""
    group, _, medium = raw.decode().partition("|")
    return medium, int(group)


def encode_residency(last_seen: float, counts: dict[int, int], progress: str = "") -> str:
    """`<last_seen><progress> <pid>:<count> ...`: a residency's time, what eviction took
    (`encode_progress`) and its non-zero counts per part. A value holds a space exactly
    when the residency holds blocks (expire.lua relies on it)."""
    return " ".join([repr(last_seen) + progress, *(f"{pid}:{n}" for pid, n in counts.items())])


def decode_residency(raw: bytes) -> tuple[float, dict[int, int]]:
    head, *counts = raw.split()
    out: dict[int, int] = {}
    for item in counts:
        pid, _, n = item.partition(b":")
        out[int(pid)] = int(n)
    return float(head.partition(b";")[0]), out


def residency_time(raw: bytes) -> float:
    """The last store time a residency value starts with."""
    return float(raw.split(b" ", 1)[0].partition(b";")[0])


class Progress(NamedTuple):
    """What a residency value says beyond its counts (`store.model.SessionOnWorker`): lost
    blocks, block size, and the frontier's hash and position (`store.model.Frontier`)."""

    lost: int = 0
    block_size: int | None = None
    frontier: Hash | None = None
    position: int | None = None


NO_PROGRESS = Progress()
"""A residency nothing was lost from, with no store seen yet."""


def encode_progress(
    lost: int, block_size: int | None, frontier: Hash | None, position: int | None
) -> str:
    """`;<lost>;<block size>;<frontier hash>;<position>` (unknowns empty; a digest as `x` +
    hex), or "" when all are unknown or zero: such a value reads as one written before these
    fields were (lost 0, frontier unknown)."""
    if not lost and block_size is None and frontier is None:
        return ""
    size = "" if block_size is None else block_size
    text = "x" + frontier.hex() if isinstance(frontier, bytes) else frontier
    return f";{lost};{size};{'' if text is None else text};{'' if position is None else position}"


def decode_progress(raw: bytes) -> Progress:
    """The `encode_progress` part of a residency value; a value without it: lost 0,
    block size and frontier unknown."""
    head = raw.split(b" ", 1)[0]
    if b";" not in head:
        return NO_PROGRESS
    _, lost, size, text, at = head.split(b";")
    frontier: Hash | None = None
    if text:
        frontier = bytes.fromhex(text[1:].decode()) if text[:1] == b"x" else int(text)
    return Progress(int(lost), int(size) if size else None, frontier, int(at) if at else None)


LOSS_FIELDS = ("l_hurt", "l_blocks", "l_tokens")
"""Meta fields of the worker's loss sums (`store.model.WorkerLosses`, in its field order):
written by its writer with every write, lowered by expire.lua when it drops a residency
that lost blocks; a worker written before they existed has none."""


def loss_fields(losses: WorkerLosses) -> list[str | int]:
    """`LOSS_FIELDS` and their values, for a meta HSET."""
    return [
        LOSS_FIELDS[0],
        losses.sessions_hurt,
        LOSS_FIELDS[1],
        losses.lost_blocks,
        LOSS_FIELDS[2],
        losses.reprefill_tokens,
    ]


def decode_losses(values: Sequence[bytes | None]) -> WorkerLosses | None:
    """The HMGET of `LOSS_FIELDS`; None for a meta without them."""
    hurt, blocks, tokens = values
    if hurt is None or blocks is None or tokens is None:
        return None
    return WorkerLosses(
        sessions_hurt=int(hurt), lost_blocks=int(blocks), reprefill_tokens=int(tokens)
    )


def roster_key(prefix: str) -> str:
    """The central replicas' roster: a sorted set of replica id -> when its record runs out
    (ms, the server's clock); its own slot, one small key."""
    return f"{prefix}:replicas"


def instances_key(prefix: str) -> str:
    """Dynamo registrations: a hash of `<instance_id>/<dp_rank>` -> msgpack
    `store.registry.DynamoInstance`; its own slot, one small key."""
    return f"{prefix}:dynamo"


class RedisPart(Part):
    """A core part with the names of its Redis keys, built once."""

    __slots__ = ("entry_keys", "orphans_key", "unconfirmed_key")

    def __init__(self, keys: WorkerKeys, pid: int, medium: str, group: int) -> None:
        super().__init__(pid, medium, group)
        self.orphans_key = keys.orphans(pid)
        self.unconfirmed_key = keys.unconfirmed(pid)
        self.entry_keys = keys.entries(pid)
        """The entry index's bucket keys, by `bucket(h)`: the writer's plan names a member's
        bucket key from them (`redis.plan.Plan.index`)."""


class MirrorResidency(Residency):
    """A core residency with its session set keys and its value's text (`value`)."""

    __slots__ = ("last_store_text", "set_keys")

    def __init__(self, session_id: str) -> None:
        super().__init__(session_id)
        self.last_store_text = repr(self.last_store)
        """`repr(last_store)`, as the value starts: kept so a removal does not format it."""
        self.set_keys: dict[int, str] = {}
        """Session set key per part id, built once (key strings cost more than set ops)."""

    def value(self) -> str:
        """The residency hash's value (`encode_residency`)."""
        progress = encode_progress(self.lost, self.block_size, self.frontier, self.position)
        if self.total and self.total == self.in_first:  # one part, the first: the common case
            return f"{self.last_store_text}{progress} 0:{self.total}"
        return encode_residency(self.last_store, self.counts(), progress)
