"""The hot requests answered by kvsi's HTTP server itself (kvsi/http.py's `DirectHttpTools`
with api/direct.py's `DirectServer`, as `kvsi serve` runs them) get, byte for byte, the
answers of the whole ASGI stack over the same server, errors included; with their request
id, log line and metrics; also when a store read waits, pipelined, and after a body."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import structlog
from prometheus_client import REGISTRY

from kvsi.api import create_app
from kvsi.api.direct import direct_server
from kvsi.http import DirectHttpTools, OneSendHttpTools, serving_protocol
from kvsi.store.base import IndexStore
from kvsi.store.memory import MemoryStore
from kvsi.store.select import open_store
from tests.api.harness import AUTH_CALLS, CALLS, BrokenStore, direct_and_plain, filled, same_answers
from tests.conftest import Serve
from tests.redis_servers import redis_cluster, redis_server  # noqa: F401  (fixtures)

REPLIED: list[int] = []
NETWORK_STORES = {"redis": "redis_server", "cluster": "redis_cluster"}
"""The network stores' params of `clients`, by the fixture of their server."""


class SlowStore(MemoryStore):
    """The hot requests' reads wait for the loop, as a store over the network does."""

    async def get_session(self, session_id: str) -> Any:
        await asyncio.sleep(0.001)
        return await super().get_session(session_id)

    async def worker_states(self) -> Any:
        await asyncio.sleep(0)
        return await super().worker_states()


def counting(app: Any) -> type[OneSendHttpTools]:
    """The protocol `kvsi serve` gives `app`, recording the status of each direct reply."""
    base = serving_protocol(direct_server(app))
    assert issubclass(base, DirectHttpTools)

    class Counting(base):  # type: ignore[valid-type, misc]
        def _reply(self, cycle: Any, status: int, headers: Any, body: bytes) -> None:
            REPLIED.append(status)
            super()._reply(cycle, status, headers, body)

    return Counting


@pytest.fixture
async def clients(
    request: pytest.FixtureRequest, serve: Serve
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """A client of the direct server and one of the whole ASGI stack, over one store."""
    store: IndexStore
    if request.param == "broken":
        store = BrokenStore()
    elif request.param in NETWORK_STORES:
        server = request.getfixturevalue(NETWORK_STORES[request.param])
        store = await filled(open_store(f"{server.url}?prefix=t-{uuid.uuid4().hex[:12]}"))
    else:
        store = await filled(SlowStore() if request.param == "slow" else None)
    direct, plain = direct_and_plain(store, tokens=request.param == "tokens")
    REPLIED.clear()
    d = await serve(direct, http=counting(direct), access_log=False)
    p = await serve(plain, http=OneSendHttpTools, access_log=False)
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{d}") as dc,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{p}") as pc,
    ):
        for client in (dc, pc):  # one id for both: each answer echoes it
            client.headers["x-request-id"] = "compared"
        yield dc, pc
    await store.close()


def _headers(response: httpx.Response) -> list[tuple[str, str]]:
    """The headers but the date, a redirect's location without its server's port."""
    port = f":{response.url.port}/"
    return [
        (k, v.replace(port, ":PORT/") if k == "location" else v)
        for k, v in response.headers.multi_items()
        if k != "date"
    ]


@pytest.mark.parametrize("clients", ["open", "slow"], indirect=True)
async def test_every_answer_is_the_stacks(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    await same_answers(clients, CALLS, _headers)
    assert REPLIED.count(200) >= 5 and 404 in REPLIED, "the hot requests were answered direct"


@pytest.mark.parametrize(
    "clients",
    [
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=[pytest.mark.redis, pytest.mark.cluster]),
    ],
    indirect=True,
)
async def test_every_answer_is_the_stacks_over_redis(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    # A network store's reads wait under asyncio.timeout, which needs a task of its own.
    await same_answers(clients, CALLS, _headers)
    assert REPLIED.count(200) >= 5 and 404 in REPLIED, "the hot requests were answered direct"


@pytest.mark.parametrize("clients", ["tokens"], indirect=True)
async def test_every_answer_is_the_stacks_with_tokens(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    # A header value ending in a space cannot be sent as such (HTTP strips it).
    sendable = [
        c for c in AUTH_CALLS if not c[2].get("headers", {}).get("authorization", "x").endswith(" ")
    ]
    await same_answers(clients, sendable, _headers)
    assert REPLIED, "the authorized ones were answered direct"


@pytest.mark.parametrize("clients", ["broken"], indirect=True)
async def test_a_store_outage_is_the_stacks_503(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    await same_answers(clients, CALLS[:1] + CALLS[7:8] + CALLS[16:17], _headers)
    assert REPLIED == [503, 503, 503]


@pytest.fixture
async def base(serve: Serve) -> str:
    app = create_app(await filled())
    port = await serve(app, http=counting(app), access_log=False)
    return f"http://127.0.0.1:{port}"


async def test_a_direct_answer_is_counted_logged_and_echoes_its_id(base: str) -> None:
    labels = {"method": "GET", "route": "/v1/sessions/{session_id}", "status": "200"}
    before = REGISTRY.get_sample_value("kvsi_http_requests_total", labels) or 0.0
    REPLIED.clear()
    async with httpx.AsyncClient(base_url=base) as client:
        merged = [structlog.contextvars.merge_contextvars]
        with structlog.testing.capture_logs(processors=merged) as logged:
            given = await client.get("/v1/sessions/s", headers={"x-request-id": "mine-1"})
            made = await client.get("/v1/sessions/s")

    assert REPLIED == [200, 200]
    assert given.headers["x-request-id"] == "mine-1"
    made_id = made.headers["x-request-id"]
    made_uuid = uuid.UUID(hex=made_id)
    assert made_uuid.hex == made_id, "a new id is a UUID's 32 hex digits"
    assert (made_uuid.version, made_uuid.variant) == (4, uuid.RFC_4122)
    lines = [e for e in logged if e["event"] == "http.request"]
    assert [(e["request_id"], e["status"], e["session_id"], e["route"]) for e in lines] == [
        ("mine-1", 200, "s", "/v1/sessions/{session_id}"),
        (made_id, 200, "s", "/v1/sessions/{session_id}"),
    ]
    assert REGISTRY.get_sample_value("kvsi_http_requests_total", labels) == before + 2


def _exchange(port: int, data: bytes, answers: int) -> list[bytes]:
    """Send `data` on one connection; the first `answers` responses, whole."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        out: list[bytes] = []
        while len(out) < answers:
            chunk = sock.recv(65536)
            assert chunk, "closed early"
            received += chunk
            while b"\r\n\r\n" in received:
                head, rest = received.split(b"\r\n\r\n", 1)
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                if len(rest) < length:
                    break
                out.append(head + b"\r\n\r\n" + rest[:length])
                received = rest[length:]
        return out


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


async def test_pipelined_requests_are_answered_in_order(base: str) -> None:
    route = b'{"session_id": "t"}'
    data = (
        b"GET /v1/sessions/s HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s"
        b"GET /v1/sessions/nobody/hint HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /v1/sessions/t HTTP/1.1\r\nHost: x\r\n\r\n"
    ) % (len(route), route)
    answers = await asyncio.to_thread(_exchange, _port(base), data, 5)
    assert [a.split(b"\r\n", 1)[0] for a in answers] == [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 404 Not Found",
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK",
    ]
    assert b'"session_id":"s"' in answers[0] and b'"ranking":[{"pod":"pod-b"' in answers[1]
    assert answers[3].endswith(b'{"status":"ok"}') and b'"session_id":"t"' in answers[4]


async def test_a_body_sent_late_and_a_closing_request(base: str) -> None:
    port = _port(base)

    def late_body() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(
                b"POST /v1/route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 19\r\nConnection: close\r\n\r\n"
            )
            sock.sendall(b'{"session_id": "s"}')
            received = b""
            while chunk := sock.recv(65536):
                received += chunk
            return received

    answer = await asyncio.to_thread(late_body)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"connection: close\r\n" in answer
    assert b'"ranking":[{"pod":"pod-a"' in answer


def test_no_direct_server_behind_a_prefix_or_while_tracing(monkeypatch: Any) -> None:
    store = MemoryStore()
    assert direct_server(create_app(store)) is not None
    assert direct_server(create_app(store, root_path="/kvsi")) is None
    assert direct_server(create_app(store, direct_routes=False)) is None
    assert serving_protocol(None) is OneSendHttpTools
    monkeypatch.setattr("kvsi.api.app.tracer", lambda: object())
    assert direct_server(create_app(store)) is None
