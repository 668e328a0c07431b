"""The hot requests answered past FastAPI (api/direct.py) get, byte for byte, the answers
FastAPI gives them, errors included; and they are indeed answered before FastAPI's router."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from kvsi.api import create_app
from kvsi.store.base import IndexStore
from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, EntriesStored, WorkerKey, WorkerState, WorkerStatus
from tests.api.harness import BIG, client_for

A = WorkerKey("pod-a", 0)
B = WorkerKey("pod-b", 1)
TOKEN = "secret-token"

Call = tuple[str, str, dict[str, Any]]

CALLS: list[Call] = [
    ("GET", "/v1/sessions/s", {}),
    ("GET", "/v1/sessions/nobody", {}),
    ("GET", "/v1/sessions/s?limit=3", {}),
    ("GET", "/v1/sessions/bad%20id", {}),
    ("GET", "/v1/sessions/" + "x" * 257, {}),
    ("GET", "/v1/sessions/s/", {}),
    ("GET", "/v1/sessions/hint", {}),
    ("GET", "/v1/sessions/s/hint", {}),
    ("GET", "/v1/sessions/s/hint?format=label", {}),
    ("GET", "/v1/sessions/s/hint?format=llm-d", {}),
    ("GET", "/v1/sessions/s/hint?format=other", {}),
    ("GET", "/v1/sessions/s/hint?format=label&format=llm-d", {}),
    ("GET", "/v1/sessions/s/hint?model=m", {}),
    ("GET", "/v1/sessions/nobody/hint", {}),
    ("HEAD", "/v1/sessions/s", {}),
    ("POST", "/v1/sessions/s", {}),
    ("POST", "/v1/route", {"json": {"session_id": "s"}}),
    ("POST", "/v1/route", {"json": {"session_id": "s", "hint": "llm-d", "limit": 1}}),
    ("POST", "/v1/route", {"json": {"block_hashes": ["1", "2", str(BIG[0])]}}),
    ("POST", "/v1/route", {"json": {"token_ids": list(range(40)), "session_id": "t"}}),
    ("POST", "/v1/route", {"json": {"session_id": "s", "limit": True}}),
    ("POST", "/v1/route", {"json": {"session_id": "s", "seed": 1}}),
    ("POST", "/v1/route", {"json": {"block_hashes": ["0xZZ"]}}),
    ("POST", "/v1/route", {"json": {}}),
    ("POST", "/v1/route", {"json": []}),
    ("POST", "/v1/route", {"content": b""}),
    ("POST", "/v1/route", {"content": b'{"session_id": "s"'}),
    ("POST", "/v1/route", {"content": b"[" * 100_000 + b"]" * 100_000}),
    ("POST", "/v1/route", {"content": b'{"session_id": "\xff"}'}),
    ("POST", "/v1/route", {"content": b'{"session_id": "s"}'}),
    (
        "POST",
        "/v1/route",
        {"content": b'{"session_id": "s"}', "headers": {"content-type": "text/plain"}},
    ),
    (
        "POST",
        "/v1/route",
        {
            "content": b'{"session_id": "s"}',
            "headers": {"content-type": "text/plain", "origin": "http://elsewhere"},
        },
    ),
    (
        "POST",
        "/v1/route",
        {"content": b'{"session_id": "s"}', "headers": {"content-type": "multipart/form-data"}},
    ),
    ("POST", "/v1/route", {"content": b'{"session_id": "s"}' + b" " * 300}),
    ("GET", "/v1/route", {}),
]
AUTH_CALLS: list[Call] = [
    (method, path, kwargs | {"headers": kwargs.get("headers", {}) | headers})
    for method, path, kwargs in CALLS[:2] + CALLS[7:8] + CALLS[16:17]
    for headers in (
        {},
        {"authorization": f"Bearer {TOKEN}"},
        {"authorization": f"bearer   {TOKEN} "},
        {"authorization": "Bearer wrong"},
        {"authorization": f"Basic {TOKEN}"},
        {"authorization": "Bearer"},
    )
]


async def _filled(store: IndexStore | None = None) -> IndexStore:
    store = MemoryStore() if store is None else store
    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 1.5))
    await store.set_status(B, WorkerStatus(WorkerState.DEGRADED, 2.0, "gap"))
    await store.apply(A, Batch(0, 10.0, [EntriesStored([1, 2, BIG[0]], "GPU", 0, "s", 16)]))
    await store.apply(B, Batch(0, 11.0, [EntriesStored([1, 5], "CPU", 0, "s")]))
    await store.apply(B, Batch(1, 12.0, [EntriesStored([7], "GPU", 0, "t")]))
    return store


class BrokenStore(MemoryStore):
    """Every read the hot requests make fails, as a store outage does."""

    async def get_session(self, session_id: str) -> Any:
        raise ConnectionError("store down")

    async def worker_states(self) -> Any:
        raise ConnectionError("store down")


@pytest.fixture
async def clients(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    store = BrokenStore() if request.param == "broken" else await _filled()
    tokens = (TOKEN,) if request.param == "tokens" else ()
    direct = create_app(store, tokens=tokens, max_body_bytes=256)
    plain = create_app(store, tokens=tokens, max_body_bytes=256, direct_routes=False)
    async with client_for(direct) as d, client_for(plain) as p:
        for client in (d, p):  # one id for both: each answer echoes it
            client.headers["x-request-id"] = "compared"
        yield d, p


async def _same_answers(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient], calls: list[Call]
) -> None:
    direct, plain = clients
    for method, path, kwargs in calls:
        got = await direct.request(method, path, **kwargs)
        want = await plain.request(method, path, **kwargs)
        where = f"{method} {path} {kwargs}"[:200]
        assert got.status_code == want.status_code, where
        assert got.headers.multi_items() == want.headers.multi_items(), where
        assert got.content == want.content, where


@pytest.mark.parametrize("clients", ["open"], indirect=True)
async def test_every_answer_is_fastapis(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    await _same_answers(clients, CALLS)


@pytest.mark.parametrize("clients", ["tokens"], indirect=True)
async def test_every_answer_is_fastapis_with_tokens(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    await _same_answers(clients, AUTH_CALLS)


@pytest.mark.parametrize("clients", ["broken"], indirect=True)
async def test_a_store_outage_is_fastapis_503(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    await _same_answers(clients, CALLS[:1] + CALLS[7:8] + CALLS[16:17])
    assert (await clients[0].get("/v1/sessions/s")).status_code == 503


class RouterSeen:
    """Records, per path, whether FastAPI's router handled the request (it puts the
    endpoint in the scope)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)
        if scope["type"] == "http":
            ROUTED[scope["path"]] = "endpoint" in scope


ROUTED: dict[str, bool] = {}


@pytest.mark.parametrize(
    ("method", "path", "body", "routed"),
    [
        ("GET", "/v1/sessions/s", None, False),
        ("GET", "/v1/sessions/s/hint", None, False),
        ("POST", "/v1/route", {"session_id": "s"}, False),
        ("GET", "/v1/sessions/s/blocks", None, True),
        ("GET", "/v1/sessions/bad%20id", None, True),
    ],
)
async def test_the_hot_requests_skip_fastapis_router(
    method: str, path: str, body: dict[str, Any] | None, routed: bool
) -> None:
    app = create_app(await _filled())
    app.add_middleware(RouterSeen)
    ROUTED.clear()
    async with client_for(app) as client:
        response = await client.request(method, path, json=body)

    assert response.status_code in (200, 400), response.text
    assert dict(ROUTED) == {path.replace("%20", " "): routed}
