"""kvsi_event_loop_lag_seconds: a stall of the event loop shows as one late timer."""

from __future__ import annotations

import asyncio
import contextlib
import time

from prometheus_client import REGISTRY

from kvsi.metrics import watch_loop_lag


def _counts() -> tuple[float, float]:
    """(samples, samples of at most 50 ms) so far."""
    total = REGISTRY.get_sample_value("kvsi_event_loop_lag_seconds_count") or 0.0
    quick = REGISTRY.get_sample_value("kvsi_event_loop_lag_seconds_bucket", {"le": "0.05"})
    return total, quick or 0.0


async def test_a_blocked_loop_is_one_late_sample() -> None:
    before_total, before_quick = _counts()
    watcher = asyncio.create_task(watch_loop_lag(0.01))
    await asyncio.sleep(0.05)
    time.sleep(0.15)  # noqa: ASYNC251 - the stall under test: nothing runs meanwhile
    await asyncio.sleep(0.05)
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    total, quick = _counts()
    assert total - before_total >= 3, "sampled while the loop ran"
    assert (total - before_total) - (quick - before_quick) >= 1, "the stall was over 50 ms"
