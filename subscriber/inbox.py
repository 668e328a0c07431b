"""The bounded hand-off between a stream's receiver task and its applier task.

Imports asyncio only. The receiver must never wait on the store (while it waits, ZMQ drops
at its own high-water mark without telling anyone), so it drops here instead, where the
drop is counted and the stream repairs the hole by replay.
"""

from __future__ import annotations

import asyncio
from collections import deque

Arrival = tuple[float, list[bytes]]
"""When a message arrived (time.monotonic) and its frames."""


class Inbox:
    """FIFO of received messages, holding at most `capacity`; a full inbox drops the newest.

    Dropping the newest, not the oldest, keeps the held messages contiguous and leaves the
    hole at the end, where the publisher's replay buffer is most likely to still cover it.
    One consumer only.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"inbox capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._items: deque[Arrival] = deque()
        self._waiter: asyncio.Future[None] | None = None
        """The consumer's wait in `get`, if it waits (a bare future: asyncio.Event's waiter
        list and loop check cost more on every message than the hand-off itself)."""
        self.overflowed = 0
        """Messages dropped because the inbox was full, since the stream started."""
        self.newest: list[bytes] | None = None
        """Frames of the last message received (held or dropped), for lag; parsed lazily."""
        self.last_dropped: list[bytes] | None = None
        """The newest message dropped since `take_dropped`: it tells how far the hole goes."""
        self._first_drop = 0.0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, burst: list[list[bytes]], arrived: float) -> bool:
        """Hold messages received together at `arrived` (time.monotonic), oldest first, as
        many as there is room for; True if the full inbox dropped any (the newest ones,
        counted, the last remembered)."""
        self.newest = burst[-1]
        items = self._items
        room = self.capacity - len(items)
        if room > 0:
            items.extend([(arrived, frames) for frames in burst[:room]])
            self._release()
        dropped = len(burst) - max(room, 0)
        if dropped <= 0:
            return False
        self.overflowed += dropped
        if self.last_dropped is None:
            self._first_drop = arrived
        self.last_dropped = burst[-1]
        return True

    def wake(self) -> None:
        """Make a waiting `get` return None now (the applier has other work)."""
        self._release()

    def _release(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> Arrival | None:
        """The oldest message, waiting for one; None after a `wake` with nothing held."""
        if self._items:
            return self._items.popleft()
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._waiter = None
        return self._items.popleft() if self._items else None

    def take(self, most: int) -> list[list[bytes]]:
        """Up to `most` of the held messages, oldest first, without waiting."""
        items = self._items
        return [items.popleft()[1] for _ in range(min(most, len(items)))]

    def take_dropped(self) -> Arrival:
        """The newest dropped message, with when the first of its run was dropped (the age of
        the hole); forgotten here. Call only when `last_dropped` is set."""
        frames, self.last_dropped = self.last_dropped, None
        if frames is None:
            raise RuntimeError("no dropped message to take")
        return self._first_drop, frames

    def oldest_arrival(self) -> float | None:
        """Arrival time of the oldest held message, None when empty."""
        return self._items[0][0] if self._items else None
