"""Fixtures every test package shares."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import uvicorn
import zmq.asyncio

from tests.native import stale_native_modules
from tests.paths import ROOT
from tests.waiting import eventually


def pytest_configure(config: pytest.Config) -> None:
    stale = stale_native_modules(ROOT)
    if stale:
        raise pytest.UsageError(f"changed since `make native` compiled them: {', '.join(stale)}")


Serve = Callable[..., Awaitable[int]]
"""`serve` fixture: `await serve(app, **config)`, the port of `app` served by uvicorn with
`config` (uvicorn.Config options)."""


@pytest.fixture(autouse=True)
def switch_interval() -> Iterator[None]:
    """The interpreter's thread switch interval as each test found it: `kvsi serve`'s CLI,
    invoked in process by some tests, sets it process-wide (`kvsi.loops`)."""
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


@pytest.fixture
def ctx() -> Iterator[zmq.asyncio.Context]:
    """A private ZMQ context, so a test's leftover socket cannot leak into the next test."""
    context = zmq.asyncio.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    """Serves apps with uvicorn on loopback ports, logging as kvsi serve configures it (no
    lifespan); each call's port once the server is up. All stop after the test."""
    running: list[tuple[uvicorn.Server, asyncio.Task[None]]] = []

    async def start(app: Any, **config: Any) -> int:
        server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off", **config))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        running.append((server, asyncio.create_task(server.serve(sockets=[sock]))))

        async def started() -> bool:
            return server.started

        await eventually(started)
        port: int = sock.getsockname()[1]
        return port

    yield start
    for server, serving in reversed(running):
        server.should_exit = True
        await serving
