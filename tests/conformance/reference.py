"""A tiny reference model of DESIGN.md's semantics, written apart from every store.

Plain sets of (medium, group, hash) per worker and per (session, worker); no cleverness.
What eviction took from a residency (`SessionOnWorker`): a plain count per (session, worker),
reset by the session's stores, and its frontier as (hash, position) by the rules of
`store.model.Frontier`, spelled out again here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    Hash,
    WorkerCleared,
    WorkerKey,
    WorkerLosses,
)

Entry = tuple[str, int, Hash]
Residency = tuple[str, WorkerKey]


@dataclass
class Progress:
    """Per residency: lost blocks, block size of the last store that had one, frontier."""

    lost: int = 0
    block_size: int | None = None
    frontier: tuple[Hash, int | None] | None = None

    def stored(self, event: EntriesStored) -> None:
        self.lost = 0
        if event.block_size is not None:
            self.block_size = event.block_size
        if not event.block_hashes:
            return
        last, n = event.block_hashes[-1], len(event.block_hashes)
        before = self.frontier
        if event.parent_block_hash is None:
            self.frontier = (last, n - 1)
        elif before is not None and event.parent_block_hash == before[0]:
            self.frontier = (last, None if before[1] is None else before[1] + n)
        elif before is not None and last == before[0]:
            pass
        else:
            self.frontier = (last, None)


@dataclass
class _Fence:
    seq: int
    epoch_ts: float
    last_ts: float


@dataclass
class Reference:
    entries: dict[WorkerKey, set[Entry]] = field(default_factory=dict)
    residency: dict[Residency, set[Entry]] = field(default_factory=dict)
    progress: dict[Residency, Progress] = field(default_factory=dict)
    fences: dict[WorkerKey, _Fence] = field(default_factory=dict)
    seen_sessions: set[str] = field(default_factory=set)
    firsts: dict[WorkerKey, set[Hash]] = field(default_factory=dict)
    """Per worker, the blocks it holds whose last store started a prompt (no parent)."""

    def apply(self, worker: WorkerKey, batch: Batch) -> str:
        fence = self.fences.get(worker)
        if fence is not None and batch.ts < fence.epoch_ts:
            return "previous_engine"
        if fence is None or batch.seq > fence.seq:
            outcome = "applied"
        elif batch.ts > fence.last_ts:
            outcome = "restarted"
            self._clear(worker)
        else:
            return "duplicate"
        for event in batch.events:
            if isinstance(event, EntriesStored):
                keys = {
                    (event.medium or "GPU", event.group_idx or 0, h) for h in event.block_hashes
                }
                self.entries.setdefault(worker, set()).update(keys)
                if event.block_hashes:
                    first = event.block_hashes[0]
                    if event.parent_block_hash is None:
                        self.firsts.setdefault(worker, set()).add(first)
                    else:
                        self.firsts.get(worker, set()).discard(first)
                if event.session_id is not None:
                    self.seen_sessions.add(event.session_id)
                    self.residency.setdefault((event.session_id, worker), set()).update(keys)
                    self.progress.setdefault((event.session_id, worker), Progress()).stored(event)
            elif isinstance(event, EntriesRemoved):
                keys = {
                    (event.medium or "GPU", event.group_idx or 0, h) for h in event.block_hashes
                }
                self.entries.setdefault(worker, set()).difference_update(keys)
                self.firsts[worker] = {
                    h for h in self.firsts.get(worker, set()) if self.holds(worker, h)
                }
                for (s, w), held in self.residency.items():
                    if w == worker:
                        self.progress[(s, w)].lost += len(held & keys)
                        held.difference_update(keys)
            elif isinstance(event, WorkerCleared):
                self._clear(worker)
        if outcome == "restarted" or fence is None:
            self.fences[worker] = _Fence(batch.seq, batch.ts, batch.ts)
        else:
            self.fences[worker] = _Fence(batch.seq, fence.epoch_ts, max(fence.last_ts, batch.ts))
        return outcome

    def _clear(self, worker: WorkerKey) -> None:
        """The worker's cache emptied: what each residency held is lost."""
        self.entries[worker] = set()
        self.firsts[worker] = set()
        for (s, w), held in self.residency.items():
            if w == worker:
                self.progress[(s, w)].lost += len(held)
                held.clear()

    def holds(self, worker: WorkerKey, h: Hash) -> bool:
        return any(entry[2] == h for entry in self.entries.get(worker, set()))

    def held_run(self, worker: WorkerKey, prompt: list[Hash]) -> list[tuple[str, ...]]:
        """The media of each block of `prompt` the worker holds, from the first on."""
        run = []
        for h in prompt:
            media = {m for m, _, held in self.entries.get(worker, set()) if held == h}
            if not media:
                break
            run.append(tuple(sorted(media)))
        return run

    def session_blocks(self, session_id: str) -> dict[WorkerKey, set[Entry]]:
        return {w: held for (s, w), held in self.residency.items() if s == session_id and held}

    def session_workers(self, session_id: str) -> dict[WorkerKey, Progress]:
        """Workers a session view lists: holding some of its blocks, or that lost some."""
        return {
            w: self.progress[(s, w)]
            for (s, w), held in self.residency.items()
            if s == session_id and (held or self.progress[(s, w)].lost)
        }

    def worker_losses(self, worker: WorkerKey) -> WorkerLosses:
        """What eviction took from the worker's residencies, summed."""
        hurt = [p for (_, w), p in self.progress.items() if w == worker and p.lost]
        return WorkerLosses(
            sessions_hurt=len(hurt),
            lost_blocks=sum(p.lost for p in hurt),
            reprefill_tokens=sum(p.lost * (p.block_size or 0) for p in hurt),
        )


def _keys(event: EntriesStored | EntriesRemoved) -> set[Entry]:
    return {(event.medium or "GPU", event.group_idx or 0, h) for h in event.block_hashes}
