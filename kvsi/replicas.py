"""A central replica's beat in the roster: when it is due, what it answered, how it leaves.

Imports the store contract's `ReplicaRoster` only (the rule of who owns which pod is
kvsi/ownership.py; what the pool does about it, kvsi/discovery.py). A beat that fails (the
store down or slow) keeps the last view until the record it renewed last has certainly run
out; then this replica claims nothing (the view is empty) and releases its pods, which the
replicas that still reach the store have taken over by then. Keeping them instead fed a
loop seen in tests: a replica too busy to beat in time lost its record, the others took its
pods, and two writers on every pod made it busier still.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from kvsi import metrics
from kvsi.store.base import ReplicaRoster

log = structlog.get_logger(__name__)


class ReplicaBeat:
    """Renews this replica's record every `beat_seconds`, each call bounded by it."""

    def __init__(self, roster: ReplicaRoster, me: str, beat_seconds: float, ttl: float) -> None:
        self.roster = roster
        self.me = me
        self.beat_seconds = beat_seconds
        self.ttl = ttl
        self._next = 0.0
        self._renewed = -ttl
        """When the last successful beat was sent: the record lasts at least `ttl` from it."""
        self._view: tuple[str, ...] | None = None
        self.epoch: int | None = None
        """The roster epoch of the last answer (`RosterView.epoch`): it moves on with every
        change of the live set, also one this replica's view did not see (a replica that
        joined and left between two beats)."""

    def wait_seconds(self, now: float) -> float:
        """Until the next beat is due."""
        return max(0.0, self._next - now)

    async def beat_if_due(self, now: float) -> tuple[str, ...] | None:
        """Beat if due; the live replicas if they differ from the last view, else None.
        Empty once the last renewed record has run out (this replica no longer claims)."""
        if now < self._next:
            return None
        self._next = now + self.beat_seconds
        try:
            # Bounded so a late answer still lands within the record it renews.
            async with asyncio.timeout(self.ttl - self.beat_seconds):
                answer = await self.roster.beat(self.me, self.ttl, self.epoch)
        except Exception as exc:  # any failure: keep the last view while the record lasts
            metrics.DISCOVERY_BEAT_FAILURES.inc()
            log.warning(
                "discovery.beat_failed",
                replica=self.me,
                error=f"{type(exc).__name__}: {exc}",
                meanwhile=f"the others take this replica's pods {self.ttl:g}s after its last beat",
            )
            if time.monotonic() - self._renewed < self.ttl or self._view == ():
                return None
            live: tuple[str, ...] = ()
        else:
            self._renewed = now
            self.epoch = answer.epoch
            live = tuple(answer.live)
        metrics.DISCOVERY_REPLICAS.set(len(live))
        if live == self._view:
            return None
        log.info(
            "discovery.replicas_changed",
            replica=self.me,
            replicas=list(live),
            was=self._view,
            epoch=self.epoch,
        )
        self._view = live
        return live

    async def leave(self) -> None:
        """Drop the record (bounded by one beat), then keep the streams running one beat and
        a half more, so the others start theirs before this replica's stop: a clean stop
        hands over without relying on replay. Then close the roster."""
        try:
            async with asyncio.timeout(self.beat_seconds):
                await self.roster.leave(self.me)
        except Exception as exc:  # the store is down: the record runs out by itself
            log.warning("discovery.leave_failed", replica=self.me, error=f"{type(exc).__name__}")
        else:
            log.info("discovery.replica_left", replica=self.me, handover_seconds=self.beat_seconds)
            await asyncio.sleep(1.5 * self.beat_seconds)
        finally:
            await self.roster.close()
