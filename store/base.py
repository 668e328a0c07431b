"""The store contract, by role: what ingest writes, what the API reads, Dynamo's registry,
the central replicas' roster.

Imports neither zmq nor fastapi. Every backend passes tests/conformance unchanged and is
checked by mypy against `IndexStore` where store/select.py opens it; each part of the
service asks for the narrowest role it uses (streams an `IndexWriter`, routes an
`IndexReader`, the Dynamo API a reader and a `DynamoRegistry`). `ReplicaRoster` is apart
from the index: central replicas splitting the pods, on a shared store only. A store whose
calls share a bounded pool of connections (Redis) is also a `PooledStore`: how often its
callers waited for one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from kvsi.store.feed import FeedHub
from kvsi.store.model import (
    ApplyOutcome,
    Batch,
    Expired,
    Fence,
    Hash,
    Page,
    SessionSummary,
    SessionView,
    WorkerKey,
    WorkerLosses,
    WorkerState,
    WorkerStatus,
    WorkerView,
)
from kvsi.store.paging import SessionOrder
from kvsi.store.registry import DynamoInstance
from kvsi.store.tokens import Edge


class IndexWriter(Protocol):
    """Ingest's side: batches applied under each worker's fence, worker status, and the
    index's own upkeep (the stale policy, idle sessions, gone workers)."""

    @property
    def applies_inline(self) -> bool:
        """Whether `apply` and `apply_many` do their work without suspending (the memory
        store): ingest then calls them in turns of the event loop it shares with the API
        (subscriber/turns.py), where a store that awaits I/O gives the loop back itself."""
        ...

    async def apply(
        self, worker: WorkerKey, batch: Batch, expect: Fence | None = None
    ) -> ApplyOutcome:
        """Apply one batch atomically with the worker's fence (see `store.model.decide`).

        DUPLICATE and PREVIOUS_ENGINE change nothing. RESTARTED empties the worker first.
        `expect`: a fence the writer saw stored; if the stored one `fell_behind` it, nothing
        is applied and IndexLostError is raised (checked in the same atomic step).
        Cost: O(blocks in the batch), plus O(sessions holding a block) per removed block.
        """
        ...

    async def apply_many(
        self, worker: WorkerKey, batches: Sequence[Batch], expect: Fence | None = None
    ) -> list[ApplyOutcome]:
        """`apply` of each batch in order (every one checked against `expect`), one outcome
        each; a backend may land them in one step (Redis: one script call when its writer
        predicts every batch applies), which is what makes catching up a backlog cheap."""
        ...

    async def fence(self, worker: WorkerKey) -> Fence | None:
        """The worker's stored fence: where a restarted subscriber resumes. None if unknown."""
        ...

    async def set_status(
        self, worker: WorkerKey, status: WorkerStatus, epoch: int | None = None
    ) -> bool:
        """Record the worker's stream health; registers a worker not seen before. `epoch`:
        the roster epoch (`RosterView.epoch`) of the central replica writing, fenced: a
        status of an older epoch than the worker's last fenced one is refused (a replica
        about to release the worker, whose view is behind the owner's), nothing written.
        None (a process that does not split the pods): always stored. Returns whether it
        was stored. O(1)."""
        ...

    async def mark_unconfirmed(self, worker: WorkerKey) -> int:
        """Flag every current entry of the worker as unconfirmed (an unrepaired gap).

        Entries stay visible; a later EntriesStored of an entry confirms it, a removal drops
        it as usual. Returns how many were flagged. Cost: O(worker entries), off the hot path;
        while flags exist, each stored block costs one more set operation.
        """
        ...

    async def drop_unconfirmed(self, worker: WorkerKey) -> int:
        """Remove the entries still unconfirmed (from the worker and every session).

        The stale policy's end: what no event reconfirmed is presumed evicted. Returns how
        many were removed. Cost: O(unconfirmed entries x sessions holding each).
        """
        ...

    async def clear_worker(self, worker: WorkerKey) -> None:
        """Drop every entry of the worker, keeping its fence and status: the engine's cache
        is gone (a restarted engine that published nothing yet), so each residency keeps
        its blocks as lost (`SessionOnWorker.lost_blocks`), as AllBlocksCleared does.

        Touches only that worker's data: O(its entries), off the hot path.
        """
        ...

    async def remove_worker(self, worker: WorkerKey) -> None:
        """Forget the worker entirely (gone for longer than the grace time)."""
        ...

    async def release(self, worker: WorkerKey) -> None:
        """Stop writing the worker from this process (another process follows it now): drop
        what this process keeps to write it; the index is unchanged. A later write of the
        worker from here starts afresh. Redis: its mirror and directory marks go (memory
        does not grow with every worker a central replica ever handed over); memory: the
        process is the index, nothing to drop. O(1).
        """
        ...

    async def expire_sessions(
        self, older_than: float, limit: int, *, written_only: bool = False
    ) -> Expired:
        """One pass of the idle rule (`store.model.idle`): drop each session residency whose
        session last stored on its worker before `older_than`, blocks or not; the blocks stay
        in the worker's index. The change feed reports a dropped residency's blocks as the
        stale policy's drops are (removed, 0 left, not losses). A session left with no
        residency, and no younger record of a removed worker, is forgotten.

        Bounded: per worker at most `limit` residencies, least recently stored first (a
        residency is looked at only if it is dropped), and at most `limit` records of
        removed workers; `Expired.more` says some were left for the next pass. Never reads
        every session or scans a keyspace. Cost: O(dropped residencies' blocks + workers);
        in memory, plus one walk of a worker's entries per 1,000 residencies holding blocks
        it drops there (a residency keeps counts, not hashes: store/core.py).
        Redis: a worker's residencies holding blocks are dropped only by a process writing
        that worker (its mirror holds the reverse map: store/README.md "Expiry").
        `written_only`: only the workers this process writes, and `Expired.sessions` not
        counted (it would read every worker): what an ingest-only sidecar does, so a fleet
        of sidecars does not sweep every worker once each; the API replicas sweep the rest.
        The memory store's process writes every worker it holds: the same either way.
        """
        ...


class IndexReader(Protocol):
    """The API's side: sessions, workers, blocks, prefix matches, the change feed and the
    Dynamo registrations that name workers."""

    async def get_session(self, session_id: str) -> SessionView | None:
        """The session's residency on every worker; None for a session never seen.

        A session whose blocks were all evicted is still returned (with zero blocks) until
        it ages out. Lists the workers holding some of its blocks or that lost some since
        the session last stored there (`SessionOnWorker.lost_blocks`). Cost: O(workers
        holding it).
        """
        ...

    async def session_blocks(
        self,
        session_id: str,
        *,
        pod: str | None,
        medium: str | None,
        limit: int,
        cursor: str | None,
    ) -> Page[Hash] | None:
        """Distinct block hashes of the session, filtered by pod and medium, in hash order.

        None for a session never seen. Raises InvalidCursorError. Cost: O(session blocks)
        on Redis; in memory O(entries of the workers holding the session's blocks), read
        from their reverse maps (a residency keeps counts, not hashes: store/core.py).
        """
        ...

    async def list_sessions(
        self,
        *,
        pod: str | None,
        limit: int,
        cursor: str | None,
        order: SessionOrder = "last_seen",
        prefix: str | None = None,
    ) -> Page[SessionSummary]:
        """Sessions in `order`; with `pod`, only those resident on it (blocks counted there);
        with `prefix`, only ids starting with it.

        `last_seen`: most recently seen first, then id; sessions holding no blocks are listed
        too (without `pod`). `blocks`: most resident blocks first, then id; only sessions
        holding blocks (the busiest ones are what this order is for). Cursors are keysets of
        one order (another order's cursor raises InvalidCursorError); a session whose place
        changes between pages may be listed twice or not at all.
        Cost per page: O(sessions) in memory. Redis: `last_seen` merges the workers' seen
        sets, O((limit + ties) x workers) per round, more rounds for a selective `pod` or
        `prefix` (up to every session); `blocks` reads every residency of the workers asked,
        O(residencies).
        """
        ...

    async def list_workers(self) -> list[WorkerView]:
        """Every known worker with counts, fence and status, ordered by pod then rank."""
        ...

    async def worker_losses(self) -> dict[WorkerKey, WorkerLosses]:
        """Per known worker, what eviction took from its sessions (`WorkerLosses`), summed
        over its residencies: for the metrics refresher, off every request path.
        Cost: O(workers): the index keeps the sums as residencies change."""
        ...

    async def worker_states(self) -> Mapping[WorkerKey, WorkerState]:
        """Every known worker's stream state, in no particular order: what a session view
        or a route needs per request, without list_workers' counts.

        The same mapping, never changed, while no worker's state changed and no worker came
        or went: a caller may keep what it derives from it (every connected worker, in rank
        order) until it gets another (api/candidates.py). A change makes a new one.

        A backend may answer from a cache as old as its cache of the worker registry (Redis:
        `registry_ttl`); a change shows at most that late. Cost: O(1) while unchanged,
        O(workers) once per change.
        """
        ...

    async def worker_blocks(
        self, pod: str, *, dp_rank: int | None, medium: str | None, limit: int, cursor: str | None
    ) -> Page[Hash] | None:
        """Distinct block hashes held by the pod (all ranks unless `dp_rank`), in hash order.

        None for an unknown pod. Raises InvalidCursorError. Cost: O(pod entries) per page.
        """
        ...

    async def match_prefix(
        self, hashes: list[Hash], workers: list[WorkerKey] | None
    ) -> dict[WorkerKey, list[tuple[str, ...]]]:
        """What a router needs to rank workers for a prompt whose blocks are `hashes`.

        For each worker holding the first block (of every known one, or of those in
        `workers`), the media holding each block of the longest run of `hashes`, from the
        first, that the worker holds in any medium or group; a worker lacking the first block
        is not in the answer. Media of a block are sorted. Found through the first-block
        directory (store/README.md): a worker's first block is one it stored with no parent.
        Cost: O(holders of the first block x matched prefix x parts), plus O(`workers`) when
        given: not the fleet.
        """
        ...

    async def match_tokens(
        self, tokens_hashes: list[int], workers: list[WorkerKey]
    ) -> dict[WorkerKey, list[tuple[str, ...]]]:
        """`match_prefix` as Dynamo's indexer matches: the prompt given by its blocks' tokens
        hashes (hashing/dynamo.py), walked per worker along the edges its stores named
        (store/tokens.py), from the first block, as far as the worker holds them. The
        media of each block of that run; a worker with an empty run is not in the answer.
        Only stores ingested with the Dynamo API on carry edges. Cost: O(`workers` x
        matched blocks x parts); Redis: one script call per worker, pipelined, then
        `match_prefix` per distinct run.
        """
        ...

    async def token_edges(self, worker: WorkerKey) -> dict[int, Edge]:
        """Every block of the worker Dynamo's edges name, with its (parent, tokens hash):
        what a Dynamo dump lists. Empty for an unknown worker. Cost: O(its edges)."""
        ...

    async def change_feed(self) -> FeedHub:
        """This process's hub of the change feed (residency and worker-state changes).

        The memory store publishes into it as it applies; the Redis store's writers append to
        a Redis Stream and the hub is fed from it (started on first call), so every API
        replica sees every writer's changes with the same ids.
        """
        ...

    async def worker_models(self) -> Mapping[WorkerKey, str | None]:
        """Every known worker's model (as its last status named it; None: unknown), in no
        particular order: what a route restricted to one model needs. Cost: O(workers); on
        Redis from a cache as old as `registry_ttl` at most (another process's status shows
        that late)."""
        ...

    async def instances(self) -> list[DynamoInstance]:
        """Every Dynamo registration, by instance id then rank.

        A backend may answer from a cache as old as its worker registry's (Redis:
        `registry_ttl`); this process's own registrations show at once. O(registrations).
        """
        ...


class DynamoRegistry(Protocol):
    """Recording Dynamo's registrations: instance ids naming some of the index's workers
    (not the index itself: no worker, entry or session changes). Reading them is the
    reader's `instances`."""

    async def register_instance(self, instance: DynamoInstance) -> DynamoInstance | None:
        """Record a Dynamo registration unless its (instance_id, dp_rank) is taken.

        None when recorded; else the registration already there, and nothing changes
        (atomic: of two racing registrations of one rank, one wins). Not part of the index:
        no worker is created or changed. O(1).
        """
        ...

    async def unregister_instance(
        self, instance_id: int, dp_rank: int | None
    ) -> list[DynamoInstance]:
        """Forget the instance's registration of `dp_rank` (every rank if None); returns the
        registrations removed. The workers and their indexes stay. O(registrations)."""
        ...


class RosterView(NamedTuple):
    """What a beat answers: the live replicas, and the epoch of that set."""

    epoch: int
    """Greater whenever the live set changed since (a replica joined, left, or ran out),
    whatever happened to the roster meanwhile: views of one epoch name one set."""
    live: list[str]
    """The live replicas' ids, sorted."""


class ReplicaRoster(Protocol):
    """Central replicas splitting the pods (kvsi/ownership.py): each renews a record with a
    TTL, and every renewal answers who is live. Not part of the index; only a shared store
    has one (store/select.py `open_roster`)."""

    async def beat(self, replica: str, ttl: float, seen: int | None = None) -> RosterView:
        """Record `replica` live for `ttl` seconds from now, drop the records that ran out,
        and return the live replicas (`replica` among them) with their epoch. One atomic
        step, timed by the store's clock, so replicas' clocks need not agree. `seen`: the
        latest epoch `replica` was answered; a roster whose epoch is below it lost its
        last writes (a failover to a replica behind) and takes a new epoch above both, so
        an epoch a beating replica saw is not answered again for another set. One that no
        replica beating since saw can be (after such a failover, to a server whose clock
        is behind the lost epoch's), and the status fence takes the two sets' statuses as
        one view's until the next change of the set. O(log replicas) to record,
        O(replicas) to answer."""
        ...

    async def leave(self, replica: str) -> None:
        """Drop `replica`'s record at once (a clean stop), a new epoch: the others take its
        pods at their next beat instead of after the TTL. O(log replicas)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class IndexStore(IndexWriter, IndexReader, DynamoRegistry, Protocol):
    """A backend: every role, and the connections it holds."""

    async def close(self) -> None:
        """Release connections."""
        ...


class ConnectionWaits(NamedTuple):
    """A store's client calls (commands, pipelines, script calls) that found no connection
    free and waited for one, since it opened."""

    waits: int
    """Calls that waited (those that then failed or were cancelled included); a call that
    got a connection at once is not counted."""
    seconds: float
    """The time they waited, summed."""


@runtime_checkable
class PooledStore(Protocol):
    """A store whose calls share a bounded pool of connections, a caller past it waiting for
    one (Redis: `max_connections` of the store URL). The memory store is not one."""

    def connection_waits(self) -> ConnectionWaits:
        """The waits so far: numbers kept as the calls wait, read without I/O, so a metrics
        scrape may read them every time. O(1)."""
        ...
