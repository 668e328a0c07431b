"""Free loopback ports for tests that must name a port before something binds it."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from contextlib import contextmanager

_BELOW_EPHEMERAL = (20_000, 32_000)
"""Linux hands out outgoing ports from 32768 up: runs picked below never race with them."""


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_run(length: int) -> int:
    """A first port of `length` consecutive free ports, below the ephemeral range."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(*_BELOW_EPHEMERAL)
        if all(_bindable(base + i) for i in range(length)):
            return base
    raise RuntimeError(f"no run of {length} free loopback ports")


def free_port() -> int:
    """One free loopback port, below the ephemeral range (see `free_port_run`)."""
    return free_port_run(1)


@contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port bound but not listening for the block: connections to it are refused.

    Holding it bound keeps every other `free_port` caller off it, which a port merely
    found free would not.
    """
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]
