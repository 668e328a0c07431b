"""The event loop a service runs on: the `event_loop` setting's choice, and its name.

Imports asyncio (and uvloop, where chosen) only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kvsi.errors import StartupError

LoopFactory = Callable[[], asyncio.AbstractEventLoop]
"""Makes the event loop a command runs on."""


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
