"""What the store applies and what it answers: events, batches, fences and views.

Imports neither zmq nor fastapi; msgspec only, so both sides share these types cheaply.
"""

from __future__ import annotations

import enum
from typing import ClassVar, Final, Generic, NamedTuple, TypeVar

import msgspec

Hash = int | bytes
"""A block hash as vLLM publishes it: an int (u64, or signed before 0.10.2) or a digest."""

DEFAULT_MEDIUM = "GPU"
"""vLLM's medium when a release or an event leaves it unset."""

Holders = str | set[str] | None
"""Who holds an entry, by session id: no session, one (the common case, kept bare to spare a
set per block), or several (a shared prefix such as a system prompt). The index core
(store/core.py) keeps residency objects the same way; `release` takes either."""

HolderT = TypeVar("HolderT")


class WorkerKey(NamedTuple):
    """One event publisher: a pod and one of its data-parallel ranks."""

    pod: str
    dp_rank: int

    def __str__(self) -> str:
        return f"{self.pod}/{self.dp_rank}"


STORED: Final = 0
"""`EntriesStored.kind`."""
REMOVED: Final = 1
"""`EntriesRemoved.kind`."""
CLEARED: Final = 2
"""`WorkerCleared.kind`."""


class EntriesStored(msgspec.Struct, frozen=True, gc=False):
    """Entries now on the worker (a block hash each, in one medium and group); the session
    residency of `session_id`, if any, gains them. The store's form of the wire's
    `BlockStored` (subscriber/decode.py).

    `medium` None means GPU and `group_idx` None means 0, as in vLLM, so the ingest decoder
    can produce these directly from the wire without a conversion pass.
    """

    block_hashes: list[Hash]
    medium: str | None = None
    group_idx: int | None = None
    session_id: str | None = None
    parent_block_hash: Hash | None = None
    """The block before the first of `block_hashes` in the request's prompt; None: they start
    it. Gives the session's frontier its position (`Frontier`)."""
    block_size: int | None = None
    """Tokens per block (every vLLM release publishes it); None: not known."""
    tokens_hashes: list[int] | None = msgspec.field(default=None, name="kvsi.tokens_hashes")
    """Dynamo's local hash of each block's tokens (hashing/dynamo.py), first block first; may
    be shorter than `block_hashes` (a block whose tokens the event lacks has none). Computed
    by ingest only when the Dynamo API is on; None otherwise. Its encoded name is none a
    vLLM event has: the ingest decoder, which reads a BlockStored straight into this type,
    never takes it from the wire."""

    kind: ClassVar[int] = STORED
    """Which event this is, for the hot paths' dispatch: `isinstance` against a Struct class
    takes the metaclass's slow path whenever the type is not exactly it (the ingest decoder
    makes subclasses), a class attribute read does not."""


class EntriesRemoved(msgspec.Struct, frozen=True, gc=False):
    """Entries evicted from one medium and group of the worker, and from every session
    residency holding them. The store's form of the wire's `BlockRemoved`."""

    block_hashes: list[Hash]
    medium: str | None = None
    group_idx: int | None = None

    kind: ClassVar[int] = REMOVED
    """See `EntriesStored.kind`."""


class WorkerCleared(msgspec.Struct, frozen=True, gc=False):
    """The worker dropped every entry (prefix cache reset); its session residencies stay,
    holding none. The store's form of the wire's `AllBlocksCleared`."""

    kind: ClassVar[int] = CLEARED
    """See `EntriesStored.kind`."""
    block_hashes: ClassVar[tuple[Hash, ...]] = ()
    """It names no block (every entry goes, named or not): a count of the blocks events name
    reads each event's `block_hashes` without asking its kind first."""


StoreEvent = EntriesStored | EntriesRemoved | WorkerCleared


class Batch(msgspec.Struct, gc=False):
    """One published batch, stamped with the publisher's seq and the engine's clock."""

    seq: int
    ts: float
    events: list[StoreEvent]


class Fence(msgspec.Struct, frozen=True, gc=False):
    """Where a worker's stream stands: the last applied seq and the engine epoch it belongs to.

    `epoch_ts` is the engine timestamp of the first batch applied after the last restart;
    batches older than it come from a previous engine and are ignored. `last_ts` tells a
    restart (seq back, newer time) from a duplicate (seq back, same or older time).
    """

    seq: int
    epoch_ts: float
    last_ts: float


class ApplyOutcome(enum.StrEnum):
    """What `apply` did with a batch; stable labels for metrics."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"
    PREVIOUS_ENGINE = "previous_engine"
    RESTARTED = "restarted"


def decide(fence: Fence | None, seq: int, ts: float) -> ApplyOutcome:
    """The fence rule every backend applies atomically with the batch (DESIGN invariants 1, 3)."""
    if fence is None:
        return ApplyOutcome.APPLIED
    if ts < fence.epoch_ts:
        return ApplyOutcome.PREVIOUS_ENGINE
    if seq > fence.seq:
        return ApplyOutcome.APPLIED
    if ts > fence.last_ts:
        return ApplyOutcome.RESTARTED
    return ApplyOutcome.DUPLICATE


def advance(fence: Fence | None, outcome: ApplyOutcome, seq: int, ts: float) -> Fence:
    """The fence after applying a batch with `outcome` (only for APPLIED and RESTARTED)."""
    if fence is None or outcome is ApplyOutcome.RESTARTED:
        return Fence(seq, ts, ts)  # (seq, epoch_ts, last_ts): three times a batch, positional
    last = fence.last_ts
    return Fence(seq, fence.epoch_ts, last if last > ts else ts)  # max(ts, last), inlined


def fell_behind(stored: Fence | None, expected: Fence | None) -> bool:
    """Whether the store's fence is behind one its writer already saw stored: data lost.

    A fence only moves forward (a newer engine, or a later seq of the same one), so a stored
    fence that is missing or older than `expected` means the store lost writes: Redis came
    back without its data, or the worker was removed meanwhile.
    """
    if expected is None:
        return False
    if stored is None:
        return True
    return (stored.epoch_ts, stored.seq) < (expected.epoch_ts, expected.seq)


class WorkerState(enum.StrEnum):
    """How far a worker's index can be trusted; only LIVE is exact."""

    CONNECTING = "connecting"
    LIVE = "live"
    DISCONNECTED = "disconnected"
    DEGRADED = "degraded"


class WorkerStatus(msgspec.Struct):
    """Stream health of one worker, written by the subscriber, read by the API."""

    state: WorkerState = WorkerState.CONNECTING
    since: float = 0.0
    detail: str = ""
    batches_lost: int = 0
    model: str | None = None
    """The model the worker serves (its topic `kv@<pod>@<model>`, or configured); None:
    unknown. Carried with the status so every API replica sees it."""
    gaps: int = 0
    """Seq gaps its stream met (repaired or not), since that stream started; with `replays`,
    `restarts` and the lag, as its writer last stored them (every status write, and at least
    every `index_audit_seconds`): what an operator's fleet view shows next to the state."""
    replays: int = 0
    restarts: int = 0
    lag_batches: int = 0
    lag_seconds: float = 0.0


class Frontier(msgspec.Struct, frozen=True, gc=False):
    """The block a session most recently stored on a worker, and where it sits in the prompt.

    `position` counts blocks from the prompt's first (0); None when the events did not tell.
    The block may have been evicted since: `blocks` says what is left. A store of the session
    there (`hashes`, a chain after `parent`) moves it to its last hash, at position
    - len(hashes) - 1 without a parent (the store starts the prompt);
    - position + len(hashes) when `parent` is the frontier (the chain goes on);
    - unchanged when it ends on the frontier (the same blocks in another medium or group);
    - unknown otherwise (a prefix another session stored, a reuse report cut short).
    Positions are thus known along one chain from its tail: O(1) per store, nothing kept
    per block. The index core moves it (`store.core.WorkerIndex.store`).
    """

    block_hash: Hash
    position: int | None = None


def idle(last_store: float, older_than: float) -> bool:
    """The idle rule (DESIGN invariant 5): a session residency whose session last stored on
    its worker (`EntriesStored` with its `session_id`, engine time) before `older_than` is
    dropped, whatever it holds. The session loses it (view, listing, its reverse-map
    entries and eviction bookkeeping); its blocks stay in the worker's index (`release`). A
    session left with no residency and no record of a removed worker is forgotten."""
    return last_store < older_than


def release(
    holders: HolderT | set[HolderT] | None, holder: HolderT
) -> HolderT | set[HolderT] | None:
    """An entry's holders after `holder`'s residency is dropped: the others, or None (the
    entry stays on the worker, held by no session)."""
    if holders is None:
        return None
    if isinstance(holders, set):
        rest = holders - {holder}
        if len(rest) > 1:
            return rest
        return next(iter(rest)) if rest else None
    return None if holders == holder else holders


class Expired(NamedTuple):
    """What one expiry pass (`IndexStore.expire_sessions`) dropped."""

    residencies: int
    """Session residencies dropped (with or without blocks)."""
    sessions: int
    """Sessions forgotten: left with no residency and no record of a removed worker."""
    more: bool
    """Some worker had more idle residencies than the pass's limit: the next pass should
    not wait."""


class SessionOnWorker(msgspec.Struct):
    """One session's residency on one worker.

    `lost_blocks`: entries of the session that eviction (a BlockRemoved, or the worker's
    cache emptied: AllBlocksCleared, an engine restart) took from this worker since the
    session last stored there; a store resets it. The stale policy's drops are not counted
    (uncertainty, not loss). `reprefill_tokens`: lost_blocks x the block size of the
    session's last store there (None: unknown), the prompt a next turn here prefills again.
    """

    pod: str
    dp_rank: int
    blocks: int
    by_medium: dict[str, int]
    last_seen: float
    lost_blocks: int = 0
    reprefill_tokens: int | None = None
    frontier: Frontier | None = None


class SessionView(msgspec.Struct):
    """Where a session's working memory lives now, worker by worker (most blocks first)."""

    session_id: str
    total_blocks: int
    last_seen: float
    workers: list[SessionOnWorker]


class SessionSummary(msgspec.Struct):
    """A line of the session list."""

    session_id: str
    blocks: int
    workers: int
    last_seen: float


class WorkerView(msgspec.Struct):
    """A worker as operators and routers see it.

    `unconfirmed` counts entries held over an unrepaired gap that no event has confirmed
    since; they are dropped when the stale policy's time runs out.
    """

    pod: str
    dp_rank: int
    blocks: int
    sessions: int
    last_seq: int | None
    last_event_at: float | None
    status: WorkerStatus
    unconfirmed: int = 0

    @property
    def model(self) -> str | None:
        """The model the worker serves, from its status; None: unknown."""
        return self.status.model


def reprefill_tokens(lost: int, block_size: int | None) -> int | None:
    """Tokens a next turn prefills again for `lost` blocks; None if the block size is unknown."""
    return None if block_size is None else lost * block_size


class WorkerLosses(msgspec.Struct, frozen=True):
    """What eviction took from the sessions of one worker, summed over its residencies
    (`SessionOnWorker.lost_blocks`): for the per-worker metrics."""

    sessions_hurt: int = 0
    """Residencies that lost blocks since their session last stored there."""
    lost_blocks: int = 0
    reprefill_tokens: int = 0
    """Sum of the residencies' `reprefill_tokens` (those of unknown block size left out)."""


T = TypeVar("T")


class Page(msgspec.Struct, Generic[T]):
    """One page of a listing; `next_cursor` is opaque and None on the last page."""

    items: list[T]
    next_cursor: str | None


PROGRAMMING_ERRORS = (
    TypeError,
    AttributeError,
    LookupError,
    AssertionError,
    NameError,
    ArithmeticError,
    UnicodeError,
)
"""What no store outage raises: a programming error, in kvsi or about a value it was not
built for (a compiled module's TypeError, say, or a str that cannot be encoded). The
callers that treat a store failure as an outage (subscriber/gate.py, api/reader.py) still
do, and also log these with their traceback, so that a bug is not taken for Redis
trouble."""


class InvalidCursorError(ValueError):
    """A cursor the store did not hand out (or from another backend)."""


class IndexLostError(RuntimeError):
    """The store no longer holds a worker's index as its writer last stored it.

    Raised by `apply` when the stored fence `fell_behind` the one the writer expects: the
    batch is not applied, and the writer rebuilds the worker (replay from seq 0) or marks
    it degraded, instead of writing on top of a hole.
    """

    def __init__(self, worker: WorkerKey, stored_seq: int | None, expected: Fence) -> None:
        where = "no fence" if stored_seq is None else f"fence seq {stored_seq}"
        super().__init__(
            f"worker {worker}: the store holds {where}, behind seq {expected.seq} "
            "that was stored before"
        )
        self.worker = worker


U64_MASK = (1 << 64) - 1


def canonical_hash(h: Hash) -> Hash:
    """The index's form of a hash: ints as unsigned 64-bit.

    vLLM before 0.10.2 published Python's signed `hash()` values; the index keeps their
    two's-complement unsigned form so every release, and every backend, agrees on one value.
    """
    return h & U64_MASK if isinstance(h, int) else h
