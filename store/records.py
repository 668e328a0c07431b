"""The index core's records: a worker's part (entries and their holders), a session residency.

Imports neither zmq, fastapi nor redis, nor any store backend; store/core.py changes them.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from kvsi.store.model import Hash
from kvsi.store.tokens import Edge


class Part:
    """One (medium, group_idx) of the worker: entry -> holders, and entries unconfirmed."""

    __slots__ = ("group", "holders", "medium", "pending", "pid")

    def __init__(self, pid: int, medium: str, group: int) -> None:
        self.pid = pid
        """The part's small integer name on its worker, in creation order."""
        self.medium = medium
        self.group = group
        self.holders: dict[Hash, Holders] = {}
        self.pending: set[Hash] = set()
        """Entries held over an unrepaired gap and not stored since (`mark_unconfirmed`)."""


class Residency:
    """One session on this worker: its entries per part, when it last stored here, and what
    eviction took since (`store.model.SessionOnWorker`)."""

    __slots__ = (
        "added",
        "batch",
        "block_size",
        "dropping",
        "frontier",
        "in_first",
        "in_others",
        "last_store",
        "lost",
        "position",
        "removed",
        "session_id",
        "total",
    )

    def __init__(self, session_id: str, last_store: float = 0.0) -> None:
        self.session_id = session_id
        self.last_store = last_store
        """Engine time of the session's latest store on this worker (the idle rule's clock)."""
        self.in_first = 0
        """Entries held in part 0 (most workers have no other): kept in the residency, not
        in a dict, so a store or a removal touches one object fewer."""
        self.in_others: dict[int, int] = {}
        """Entries held per other part id; a part with none is absent."""
        self.total = 0
        """The sum of the counts, kept as they change: counting is on every query path."""
        self.lost = 0
        self.block_size: int | None = None
        self.frontier: Hash | None = None
        """The last block hash the session stored here; `position` its place (`Frontier`)."""
        self.position: int | None = None
        self.batch = 0
        """The write `added` and `removed` count for (the change feed's per-write delta)."""
        self.added = 0
        self.removed = 0
        self.dropping = 0
        """Entries the removal in progress takes from it (`WorkerIndex.remove`); 0 outside."""

    def counts(self) -> dict[int, int]:
        """Entries held per part id, the parts holding none left out."""
        if self.in_first:
            return {0: self.in_first, **self.in_others}
        return dict(self.in_others)

    def holds_in(self, pid: int) -> bool:
        return bool(self.in_first) if pid == 0 else pid in self.in_others


Holders = Residency | set[Residency] | None
"""Who holds an entry in a part: no session, one session's residency (the common case, kept
bare to spare a set per block), or several (a shared prefix such as a system prompt). The
residency itself, not its session id: a removal reaches it without a lookup."""


class Removed:
    """What a removal took, worked out only when asked (the memory store never asks): every
    entry gone, those no session held, and per session the entries it lost (in order of
    first loss)."""

    __slots__ = ("hashes", "popped", "unlinked")

    def __init__(self, hashes: Collection[Hash], popped: list[Holders | bool]) -> None:
        self.hashes = hashes
        self.popped = popped
        """Each hash's holders as the removal found them; False: not on the worker."""
        self.unlinked: list[tuple[int, Edge]] = []
        """Dynamo's edges (store/tokens.py) of the blocks the worker no longer holds."""

    def gone(self) -> list[Hash]:
        return [h for h, cur in zip(self.hashes, self.popped, strict=True) if cur is not False]

    def orphans(self) -> list[Hash]:
        return [h for h, cur in zip(self.hashes, self.popped, strict=True) if cur is None]

    def sessions(self) -> dict[str, list[Hash]]:
        out: dict[str, list[Hash]] = {}
        for h, cur in zip(self.hashes, self.popped, strict=True):
            if cur is None or cur is False or cur is True:
                continue
            for res in (cur,) if isinstance(cur, Residency) else cur:
                group = out.get(res.session_id)
                if group is None:
                    out[res.session_id] = [h]
                else:
                    group.append(h)
        return out


ABSENT: Final[set[Residency]] = set()
"""Default of `holders.get`: an object of the holder type that is never stored."""
