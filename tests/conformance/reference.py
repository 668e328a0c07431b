"""A tiny reference model of DESIGN.md's semantics, written apart from every store.

Plain sets of (medium, group, hash) per worker and per (session, worker); no cleverness.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from store.model import AllCleared, Batch, BlocksRemoved, BlocksStored, Hash, WorkerKey

Entry = tuple[str, int, Hash]


@dataclass
class _Fence:
    seq: int
    epoch_ts: float
    last_ts: float


@dataclass
class Reference:
    entries: dict[WorkerKey, set[Entry]] = field(default_factory=dict)
    residency: dict[tuple[str, WorkerKey], set[Entry]] = field(default_factory=dict)
    fences: dict[WorkerKey, _Fence] = field(default_factory=dict)
    seen_sessions: set[str] = field(default_factory=set)

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
            if isinstance(event, BlocksStored):
                keys = {
                    (event.medium or "GPU", event.group_idx or 0, h) for h in event.block_hashes
                }
                self.entries.setdefault(worker, set()).update(keys)
                if event.session_id is not None:
                    self.seen_sessions.add(event.session_id)
                    self.residency.setdefault((event.session_id, worker), set()).update(keys)
            elif isinstance(event, BlocksRemoved):
                keys = {
                    (event.medium or "GPU", event.group_idx or 0, h) for h in event.block_hashes
                }
                self.entries.setdefault(worker, set()).difference_update(keys)
                for (_, w), held in self.residency.items():
                    if w == worker:
                        held.difference_update(keys)
            elif isinstance(event, AllCleared):
                self._clear(worker)
        if outcome == "restarted" or fence is None:
            self.fences[worker] = _Fence(batch.seq, batch.ts, batch.ts)
        else:
            self.fences[worker] = _Fence(batch.seq, fence.epoch_ts, max(fence.last_ts, batch.ts))
        return outcome

    def _clear(self, worker: WorkerKey) -> None:
        self.entries[worker] = set()
        for (_, w), held in self.residency.items():
            if w == worker:
                held.clear()

    def session_blocks(self, session_id: str) -> dict[WorkerKey, set[Entry]]:
        return {w: held for (s, w), held in self.residency.items() if s == session_id and held}


def _keys(event: BlocksStored | BlocksRemoved) -> set[Entry]:
    return {(event.medium or "GPU", event.group_idx or 0, h) for h in event.block_hashes}
