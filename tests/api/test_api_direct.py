"""The hot requests answered past FastAPI (api/direct.py) get, byte for byte, the answers
FastAPI gives them, errors included; and they are indeed answered before FastAPI's router."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from kvsi.api import create_app
from tests.api.harness import (
    AUTH_CALLS,
    CALLS,
    BrokenStore,
    client_for,
    direct_and_plain,
    filled,
    same_answers,
)


@pytest.fixture
async def clients(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    store = BrokenStore() if request.param == "broken" else await filled()
    direct, plain = direct_and_plain(store, tokens=request.param == "tokens")
    async with client_for(direct) as d, client_for(plain) as p:
        for client in (d, p):  # one id for both: each answer echoes it
            client.headers["x-request-id"] = "compared"
        yield d, p


@pytest.mark.parametrize("clients", ["open"], indirect=True)
async def test_every_answer_is_fastapis(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    await same_answers(clients, CALLS)


@pytest.mark.parametrize("clients", ["tokens"], indirect=True)
async def test_every_answer_is_fastapis_with_tokens(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    await same_answers(clients, AUTH_CALLS)


@pytest.mark.parametrize("clients", ["broken"], indirect=True)
async def test_a_store_outage_is_fastapis_503(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    await same_answers(clients, CALLS[:1] + CALLS[7:8] + CALLS[16:17])
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
    app = create_app(await filled())
    app.add_middleware(RouterSeen)
    ROUTED.clear()
    async with client_for(app) as client:
        response = await client.request(method, path, json=body)

    assert response.status_code in (200, 400), response.text
    assert dict(ROUTED) == {path.replace("%20", " "): routed}
