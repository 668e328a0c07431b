"""Ingest's share of the event loop, when the store applies without suspending.

The memory store applies a batch inside the call (`IndexWriter.applies_inline`): a stream
draining its inbox runs until it yields. Each stream yields often enough for itself, but a
backlog across many streams at once (a burst of the fleet, a pause of the process) made one
turn of the event loop as long as the whole backlog's apply: every request that arrived
meanwhile waited for all of it. With turns, applies stop at a budget of time; past it, a
stream about to apply waits, and the waiting streams are let go one a turn of the loop, in
the order they came, each after the loop has read its sockets (the API's requests first
among them): one applies a run, then goes on until the new budget is spent or it pauses
(its inbox empty, its upkeep). A backlog then drains at the store's speed, about a budget a
turn, while a request waits for about one budget of applies plus the run in progress (a
replay's, `YIELD_EVERY` replies), not for the whole backlog. The budget counts the applies
since the last turn was scheduled, which may span a few idle turns of the loop: an apply
may then wait a turn it did not need to, never one more than the bound.

A store whose apply suspends (Redis: the loop serves requests while a reply is awaited)
has no budget: every apply goes at once.

A rule over one event loop, no I/O of its own: a stream (stream.py) asks before each run of
live batches and a replay (replay.py) every `YIELD_EVERY` replies, and each reports the time
it took; the pool (pool.py) makes one for the process.
"""

from __future__ import annotations

import asyncio
from collections import deque

TURN_SECONDS = 0.002
"""The applies' time before the next apply waits for a later turn of the event loop: a
request's wait behind a backlog is about this plus the run in progress (up to
applier.RUN_MAX live batches), and against it the cost of a turn of the loop (a poll of its
sockets, a task woken) is small."""


class Turns:
    """When the streams of one process may apply. `budget` None: always at once."""

    def __init__(self, budget: float | None) -> None:
        self._budget = budget
        self._spent = 0.0
        """Time the applies took since the last turn began."""
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._turn_due = False
        """A `_next_turn` is scheduled (one at a time)."""

    @property
    def bounded(self) -> bool:
        """Whether applies are bounded by a budget (then a caller yields by waiting)."""
        return self._budget is not None

    def open(self, held: bool = False) -> bool:
        """Whether an apply may go now: the budget is not spent, and nobody waits before it
        unless `held` (the caller was let go by `wait` and has applied without a pause
        since): the turn is its own until the budget is spent, then it waits again."""
        budget = self._budget
        return budget is None or (self._spent < budget and (held or not self._waiting))

    async def wait(self) -> None:
        """Until this caller's turn: after the callers that waited before it, each a turn of
        the loop of its own."""
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        self._schedule()
        await turn

    def spend(self, seconds: float) -> None:
        """An apply took `seconds`; past the budget, a new turn is scheduled."""
        budget = self._budget
        if budget is None:
            return
        self._spent += seconds
        if self._spent >= budget:
            self._schedule()

    def _schedule(self) -> None:
        if not self._turn_due:
            self._turn_due = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """Runs one turn of the loop after it was scheduled: a new budget, and the first
        waiting caller let go (it runs in the turn after, once the loop read its sockets).
        While callers wait, the next turn is scheduled at once: one of them a turn."""
        self._turn_due = False
        self._spent = 0.0
        waiting = self._waiting
        while waiting:
            turn = waiting.popleft()
            if not turn.done():  # a cancelled caller is passed over
                turn.set_result(None)
                break
        if waiting:
            self._schedule()
