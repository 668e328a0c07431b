"""A worker's trust state as the API shows it: connection, degradation, the stale clock.

Imports the store model only; no zmq, no store calls. The stream changes it; the stream's
status writer publishes `status()` whenever `changed` is set, so there is one writer of a
worker's status and the latest state always wins.
"""

from __future__ import annotations

import asyncio
import time

from kvsi.store.model import WorkerState, WorkerStatus


class WorkerHealth:
    """Connection and exactness of one worker's index, folded into one WorkerStatus.

    Only LIVE is exact. DEGRADED wins over every other state: a stream that a resource limit
    keeps from its sockets is never shown live or connecting while nothing arrives; a gap
    that replay could not repair stays visible while the publisher disconnects and
    reconnects, and ends only when the worker's index is provably exact again (an engine
    restart or an AllBlocksCleared applied after the gap: the worker is empty, then rebuilt
    from events alone).
    """

    def __init__(self, endpoint: str, model: str | None = None) -> None:
        self._endpoint = endpoint
        self.model = model
        """The model the worker serves, stored with its status; None: unknown so far."""
        self.connected: bool | None = None
        """None until the publisher's socket first connects."""
        self._lost: str | None = None
        self._repairing: str | None = None
        self._blocked: str | None = None
        self._syncing = False
        """Connected, and the history the publisher still buffers not asked for yet."""
        self.batches_lost = 0
        """Batches missed and not repaired since the stream started (what /v1/pods shows)."""
        self.stale_deadline: float | None = None
        """time.monotonic() at which still-unconfirmed entries are dropped; None: none due."""
        self._state = WorkerState.CONNECTING
        self._since = time.time()
        self.changed = asyncio.Event()
        self.changed.set()
        self.version = 1
        """Bumped on every change; the status writer reports the version it stored."""
        self._stored = 0
        self._stored_changed = asyncio.Event()

    @property
    def degraded(self) -> bool:
        """The index of this worker is not exact (may miss blocks, or hold stale ones)."""
        return self._lost is not None

    @property
    def repairing_detail(self) -> str | None:
        """The known loss being repaired by replay, if any."""
        return self._repairing

    @property
    def blocked_detail(self) -> str | None:
        """The resource limit that keeps the stream from its publisher, if any."""
        return self._blocked

    def status(self) -> WorkerStatus:
        """The status to store now."""
        if self._blocked is not None:
            detail = self._blocked if self._lost is None else f"{self._blocked}; {self._lost}"
        elif self._lost is not None:
            detail = self._lost
            if self.connected is False:
                detail += f"; publisher {self._endpoint} disconnected"
        elif self._repairing is not None:
            detail = self._repairing
        elif self._state is WorkerState.DISCONNECTED:
            detail = f"publisher {self._endpoint} disconnected"
        elif self._state is WorkerState.CONNECTING and self.connected:
            detail = f"connected to {self._endpoint}; replaying what it still buffers"
        elif self._state is WorkerState.CONNECTING:
            detail = f"connecting to {self._endpoint}"
        else:
            detail = ""
        return WorkerStatus(self._state, self._since, detail, self.batches_lost, self.model)

    def name_model(self, model: str | None) -> None:
        """The publisher's topic named the worker's model (None: it named none)."""
        if model is not None and model != self.model:
            self.model = model
            self.version += 1
            self.changed.set()

    def connect(self, connected: bool) -> None:
        """The publisher's socket connected or disconnected. Connected, the worker stays
        CONNECTING until `synced`: what the publisher buffered is not in the index yet."""
        self.connected = connected
        self._syncing = connected
        self._refresh()

    def synced(self) -> None:
        """The catch-up after a connect has ended (what it recovered is applied, what it
        could not is shown as lost): LIVE, unless something else is wrong."""
        if self._syncing:
            self._syncing = False
            self._refresh()

    def lose(self, batches: int, detail: str, *, stale_deadline: float | None) -> None:
        """Batches are lost for good: DEGRADED, with why and since when.

        `stale_deadline` starts (or restarts) the stale policy's clock; None keeps the one
        already running (a restart gap flags nothing: see subscriber/README.md).
        """
        self.batches_lost += batches
        self._lost = detail
        self._repairing = None
        if stale_deadline is not None:
            self.stale_deadline = stale_deadline
        self._refresh()

    def stale_dropped(self, entries: int) -> None:
        """The stale policy ran: what no event reconfirmed is gone from the index."""
        self.stale_deadline = None
        if self._lost is not None:
            self._lost += (
                f"; {entries} entries not reconfirmed since were dropped "
                "(the index may under-report this worker, never over-report)"
            )
        self._refresh()

    def exact_again(self) -> None:
        """The worker was emptied and rebuilt from events alone: nothing stale is left."""
        if self._lost is None and self.stale_deadline is None:
            return
        self._lost = None
        self.stale_deadline = None
        self._refresh()

    def blocked(self, detail: str | None) -> None:
        """A resource limit (sockets, descriptors, memory) keeps the stream from opening a
        socket: DEGRADED with why, until it opens; None: it did."""
        if detail == self._blocked:
            return
        self._blocked = detail
        self._refresh()

    def repairing(self, detail: str | None) -> None:
        """A known loss is being repaired by replay (DEGRADED until it is); None: done."""
        if detail == self._repairing:
            return
        self._repairing = detail
        self._refresh()

    def stored(self, version: int) -> None:
        """The status of `version` is in the store (called by the status writer)."""
        if version > self._stored:
            self._stored = version
            self._stored_changed.set()

    async def until_stored(self) -> None:
        """Wait until the store shows the current state (or a later one)."""
        wanted = self.version
        while self._stored < wanted:
            self._stored_changed.clear()
            await self._stored_changed.wait()

    def seconds_to_stale_drop(self) -> float | None:
        """How long the applier may sleep before the stale policy is due; None: no limit."""
        if self.stale_deadline is None:
            return None
        return max(0.0, self.stale_deadline - time.monotonic())

    def _refresh(self) -> None:
        if self._lost is not None or self._repairing is not None or self._blocked is not None:
            state = WorkerState.DEGRADED
        elif self.connected is None or self._syncing:
            state = WorkerState.CONNECTING
        elif self.connected:
            state = WorkerState.LIVE
        else:
            state = WorkerState.DISCONNECTED
        if state is not self._state:
            self._state = state
            self._since = time.time()
        self.version += 1
        self.changed.set()
