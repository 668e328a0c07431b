"""The memory store's first-block directory: which workers may hold a block they stored as a
prompt's first, so that a prefix match looks at those workers and not the fleet (store/README
"Memory: first blocks"). No I/O.

The rule is the Redis block directory's (store/directory.py): every worker holding a block
it stored with no parent (vLLM's position 0, where every prefix match starts) is named under
it; more may be named (the block evicted since, the worker cleared or removed), never fewer.
Ingest only adds (one dict look-up per store that starts a prompt); reads drop what they
find stale, and the janitor's passes walk the whole directory a chunk at a time, so what is
named and no longer held is bounded by what one walk's time stores.
"""

from __future__ import annotations

from collections.abc import Callable

from kvsi.store.model import Hash, WorkerKey

Holds = Callable[[WorkerKey, Hash], bool]
"""Whether a worker (still registered) holds a block, in any part."""


class FirstBlocks:
    """First block -> the worker storing it (one) or a set of them (several): a superset."""

    __slots__ = ("_named", "_walk")

    def __init__(self) -> None:
        self._named: dict[Hash, WorkerKey | set[WorkerKey]] = {}
        self._walk: list[Hash] = []
        """The blocks the current walk has still to look at (`sweep`)."""

    def __len__(self) -> int:
        return len(self._named)

    def note(self, first: Hash, worker: WorkerKey) -> None:
        """`worker` stored `first` with no parent (the ingest path: O(1))."""
        named = self._named
        got = named.get(first)
        if got is None:
            named[first] = worker
        elif isinstance(got, set):
            got.add(worker)
        elif got is not worker and got != worker:
            named[first] = {got, worker}

    def holders(self, first: Hash, holds: Holds) -> list[WorkerKey]:
        """The workers named under `first` that hold it; the others are dropped."""
        got = self._named.get(first)
        if got is None:
            return []
        named = list(got) if isinstance(got, set) else [got]
        held = [w for w in named if holds(w, first)]
        if len(held) < len(named):
            self._keep(first, held)
        return held

    def sweep(self, holds: Holds, limit: int) -> int:
        """Look at up to `limit` blocks of the current walk (a new walk starts when one
        ends), dropping the workers that no longer hold them. Returns the blocks looked at."""
        if not self._walk:
            self._walk = list(self._named)
        walk = self._walk
        chunk = walk[-limit:]
        del walk[-limit:]
        for first in chunk:
            self.holders(first, holds)
        return len(chunk)

    def _keep(self, first: Hash, held: list[WorkerKey]) -> None:
        if not held:
            del self._named[first]
        elif len(held) == 1:
            self._named[first] = held[0]
        else:
            self._named[first] = set(held)
