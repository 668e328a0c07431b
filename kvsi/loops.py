"""The event loop a service runs on: the `event_loop` setting's choice, its name, and how long
a thread beside it may hold the interpreter.

Imports asyncio, sys (and uvloop, where chosen) only.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Final

from kvsi.errors import StartupError

LoopFactory = Callable[[], asyncio.AbstractEventLoop]
"""Makes the event loop a command runs on."""

THREAD_SWITCH_SECONDS: Final = 0.001
"""How long a thread may keep the GIL while the event loop waits for it. The service hands
O(workers) CPU work to threads so that the loop keeps serving (the index gauges' build,
`/metrics`' rendering, Dynamo's token hashing); at CPython's default interval each such
thread still stops the loop for up to a whole interval at a time (bench/README.md,
api_background.py)."""


def share_the_interpreter() -> None:
    """Make the threads beside the event loop hand the GIL back within
    THREAD_SWITCH_SECONDS (process-wide: call once, before serving)."""
    sys.setswitchinterval(THREAD_SWITCH_SECONDS)


def loop_factory(name: str) -> LoopFactory | None:
    """The event loop the `event_loop` setting names: uvloop's, or None for asyncio's
    (`auto`: uvloop's where it is installed)."""
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if name == "uvloop":
            raise StartupError(
                "event_loop: uvloop is not installed (pip install uvloop, or KVSI_EVENT_LOOP="
                "asyncio)"
            ) from None
        return None
    factory: LoopFactory = uvloop.new_event_loop
    return factory


def loop_name() -> str:
    """The running loop's library, as the setting names it: `uvloop` or `asyncio`."""
    return type(asyncio.get_running_loop()).__module__.split(".")[0]
