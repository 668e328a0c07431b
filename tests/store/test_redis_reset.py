"""A connection reset while it sits idle (a TCP RST from the server or a middlebox in
between) costs a command no failure: the store's connections connect again before they
write, on asyncio's loop and on uvloop (which refuses a write to a closed transport with a
RuntimeError no retry would take). The writer's pipelined script may fail its next call with
a ConnectionError, as a store outage (the stream retries it), and connects again after it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import redis.exceptions

from kvsi.loops import loop_factory
from kvsi.store.model import ApplyOutcome, Batch, EntriesStored, WorkerKey
from kvsi.store.redis import RedisStore
from kvsi.store.redis.store import open_client
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.redis

LOOPS = ("asyncio", "uvloop")


class ResettingProxy:
    """A loopback TCP proxy to `port` (threads, apart from the loop under test) whose
    `reset()` ends every client connection with an RST."""

    def __init__(self, port: int) -> None:
        self._upstream = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._clients: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(("127.0.0.1", self._upstream))
                with self._lock:
                    self._clients.append(client)
                for a, b in ((client, server), (server, client)):
                    threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.close()

    def reset(self) -> int:
        """RST every client connection (SO_LINGER 0, then close); how many there were."""
        with self._lock:
            clients, self._clients = self._clients, []
        reset = 0
        for client in clients:
            with contextlib.suppress(OSError):  # closed already: its peer hung up
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                # Wakes the thread reading it, so the close below is the socket's last.
                client.shutdown(socket.SHUT_RD)
                reset += 1
            client.close()
        return reset

    def close(self) -> None:
        self.reset()
        self._listener.close()


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[ResettingProxy]:
    through = ResettingProxy(redis_server.port)
    try:
        yield through
    finally:
        through.close()


def run_on(loop: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        runner.run(main())


async def _after_a_reset(proxy: ResettingProxy) -> None:
    assert proxy.reset() >= 1
    await asyncio.sleep(0.2)  # the RST reaches the client's loop: its transports close


@pytest.mark.parametrize("loop", LOOPS)
def test_pooled_commands_connect_again(proxy: ResettingProxy, loop: str) -> None:
    async def main() -> None:
        client, _ = open_client(f"redis://127.0.0.1:{proxy.port}")
        try:
            assert await client.set("k", "v")
            await _after_a_reset(proxy)
            assert await client.get("k") == b"v"
        finally:
            await client.aclose()

    run_on(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_reads_and_writes_of_the_store_go_on(proxy: ResettingProxy, loop: str) -> None:
    worker = WorkerKey("pod-a", 0)

    def batch(seq: int) -> Batch:
        return Batch(seq, 1.0 + seq, [EntriesStored([100 + seq], session_id="sess-a")])

    async def main() -> None:
        store = RedisStore.from_url(f"redis://127.0.0.1:{proxy.port}?prefix=reset-{loop}")
        try:
            assert await store.apply(worker, batch(1)) is ApplyOutcome.APPLIED
            assert await store.get_session("sess-a") is not None
            await _after_a_reset(proxy)
            assert await store.get_session("sess-a") is not None
            try:
                outcome = await store.apply(worker, batch(2))
            except redis.exceptions.ConnectionError:  # a store outage to the stream: it retries
                outcome = await store.apply(worker, batch(2))
            assert outcome in (ApplyOutcome.APPLIED, ApplyOutcome.DUPLICATE)
            view = await store.get_session("sess-a")
            assert view is not None and view.total_blocks == 2
        finally:
            await store.close()

    run_on(loop, main)
