"""kvsi/http.py: a response's writes of one loop turn reach the socket as one send, in order,
and a real server answers through it as before."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from typing import Any

import pytest
from fastapi import FastAPI

from kvsi.http import OneSend, OneSendHttpTools, Reply, serving_protocol
from tests.conftest import Serve


class Recorder(asyncio.Protocol):
    """The client end: every chunk as received."""

    def __init__(self) -> None:
        self.data = b""
        self.closed = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed.set()


async def _pair() -> tuple[asyncio.Transport, Recorder, list[bytes], asyncio.Server]:
    """A real loopback connection: the server's transport (its writes recorded) and the
    client's protocol."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[asyncio.Transport] = loop.create_future()

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            accepted.set_result(transport)

    server = await loop.create_server(Server, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, client = await loop.create_connection(Recorder, "127.0.0.1", port)
    transport = await accepted
    sent: list[bytes] = []
    write = transport.write

    def recorded(data: bytes | bytearray | memoryview) -> None:
        sent.append(bytes(data))
        write(data)

    transport.write = recorded  # type: ignore[method-assign]
    return transport, client, sent, server


async def test_writes_of_one_turn_are_one_send_in_order() -> None:
    transport, client, sent, server = await _pair()
    one = OneSend(transport)

    one.write(b"HTTP/1.1 200 OK\r\n\r\n")
    one.write(b"body")
    assert sent == []
    await asyncio.sleep(0)
    one.write(b"next")
    await asyncio.sleep(0)

    assert sent == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"next"]
    one.close()
    await client.closed.wait()
    assert client.data == b"HTTP/1.1 200 OK\r\n\r\nbodynext"
    server.close()


async def test_close_sends_what_is_held_first() -> None:
    transport, client, sent, server = await _pair()
    one = OneSend(transport)

    one.write(b"last words")
    one.close()
    await client.closed.wait()

    assert sent == [b"last words"]
    assert client.data == b"last words"
    assert one.is_closing()
    server.close()


@pytest.fixture
async def port(serve: Serve) -> int:
    """uvicorn serving a small app through `OneSendHttpTools`, as kvsi serve configures it."""
    return await serve(_hello_app(), http=OneSendHttpTools)


def _hello_app() -> FastAPI:
    """`GET /hello`: a small JSON answer."""
    app = FastAPI()

    @app.get("/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    return app


async def test_a_real_server_answers_keep_alive_requests(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        for _ in range(3):
            await loop.sock_sendall(sock, b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b'{"hello":"world"}'):
                answer += await loop.sock_recv(sock, 4096)
            assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
            assert b"content-length: 17\r\n" in answer


@pytest.fixture
async def slow_port(serve: Serve) -> int:
    """`OneSendHttpTools` with a short keep-alive timeout and an answer that takes longer."""
    app = _hello_app()

    @app.get("/slow")
    async def slow() -> dict[str, str]:
        await asyncio.sleep(KEEP_ALIVE * 2)
        return {"hello": "world"}

    return await serve(app, http=OneSendHttpTools, timeout_keep_alive=KEEP_ALIVE)


KEEP_ALIVE = 0.4


async def _ask(sock: socket.socket, path: str) -> None:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b'{"hello":"world"}'):
        chunk = await loop.sock_recv(sock, 4096)
        assert chunk, f"closed before {path} was answered"
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


async def _closed_within(sock: socket.socket, seconds: float) -> float:
    """How long until the server closes the connection (it must within `seconds`)."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    assert await asyncio.wait_for(loop.sock_recv(sock, 4096), seconds) == b""
    return loop.time() - began


async def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(slow_port: int) -> None:
    with socket.create_connection(("127.0.0.1", slow_port)) as sock:
        sock.setblocking(False)
        await _ask(sock, "/hello")
        assert await _closed_within(sock, 10) >= KEEP_ALIVE * 0.9


async def test_a_connection_asked_again_before_its_timeout_stays_open(slow_port: int) -> None:
    """Requests a third of the timeout apart for three timeouts: the timer set after the
    first answer fires while the connection is in use and must not close it."""
    with socket.create_connection(("127.0.0.1", slow_port)) as sock:
        sock.setblocking(False)
        for _ in range(9):
            await _ask(sock, "/hello")
            await asyncio.sleep(KEEP_ALIVE / 3)
        await _ask(sock, "/hello")
        assert await _closed_within(sock, 10) >= KEEP_ALIVE * 0.9


async def test_an_answer_longer_than_the_timeout_is_not_cut(slow_port: int) -> None:
    """The timer of the first answer fires while the second is being worked on."""
    with socket.create_connection(("127.0.0.1", slow_port)) as sock:
        sock.setblocking(False)
        await _ask(sock, "/hello")
        await asyncio.sleep(KEEP_ALIVE / 2)
        await _ask(sock, "/slow")
        assert await _closed_within(sock, 10) >= KEEP_ALIVE * 0.9


class FastAnswers:
    """Direct answers (kvsi.http.DirectAnswers) for `/fast`, at once, in the callback that
    read the request."""

    eager = True

    def takes(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> bool:
        return path == "/fast"

    async def answer(self, scope: dict[str, Any], body: bytes, reply: Reply) -> bool:
        reply(200, [(b"content-length", b"17")], b'{"hello":"world"}')
        return True


async def test_a_request_read_with_an_answered_one_is_not_cut(serve: Serve) -> None:
    """`/fast` answered directly while the same read holds `/slow`: the timer the first
    answer sets must not close the connection while `/slow` is worked on."""
    app = FastAPI()

    @app.get("/slow")
    async def slow() -> dict[str, str]:
        await asyncio.sleep(KEEP_ALIVE * 3)
        return {"hello": "world"}

    port = await serve(app, http=serving_protocol(FastAnswers()), timeout_keep_alive=KEEP_ALIVE)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        ask = b"GET /fast HTTP/1.1\r\nHost: x\r\n\r\nGET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
        await loop.sock_sendall(sock, ask)
        answers = b""
        while answers.count(b'{"hello":"world"}') < 2:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 4096), 10)
            assert chunk, f"closed after {answers.count(b'HTTP/1.1 200')} of 2 answers"
            answers += chunk
        assert await _closed_within(sock, 10) >= KEEP_ALIVE * 0.9
