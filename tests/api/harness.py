"""Helpers shared by the API tests: feeding a store in order, reading pages, JSON checks;
the calls and stores that compare the direct routes with the whole stack.

Imports neither zmq nor subscriber/.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import FastAPI

from kvsi.api import create_app
from kvsi.store.base import IndexStore
from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    Batch,
    EntriesStored,
    StoreEvent,
    WorkerKey,
    WorkerState,
    WorkerStatus,
)

BIG = [2**64 - 1 - 7 * i for i in range(250)]
"""Integer hashes above 2^63: exact only as strings."""

DIGESTS = [bytes([i]) * 32 for i in range(60)]
"""32-byte digest hashes (vLLM's sha256 block hashing)."""


class Feed:
    """Applies batches with the next seq per worker, like one ordered stream."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store
        self._seq: dict[WorkerKey, int] = {}

    async def __call__(self, worker: WorkerKey, ts: float, *events: StoreEvent) -> None:
        seq = self._seq.get(worker, 0) + 1
        self._seq[worker] = seq
        await self.store.apply(worker, Batch(seq=seq, ts=ts, events=list(events)))


def client_for(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


def client_over(store: IndexStore) -> httpx.AsyncClient:
    return client_for(create_app(store))


async def get_json(client: httpx.AsyncClient, url: str, status: int = 200) -> Any:
    """GET `url`, assert the status, return the decoded body."""
    response = await client.get(url)
    assert response.status_code == status, response.text
    return response.json()


async def collect_pages(
    client: httpx.AsyncClient, url: str, key: str, limit: int
) -> tuple[list[Any], int]:
    """Follow `next_cursor` from the first page to the last: (all items in order, pages)."""
    items: list[Any] = []
    cursor: str | None = None
    pages = 0
    while True:
        params: dict[str, str | int] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        response = await client.get(url, params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        pages += 1
        assert len(body[key]) <= limit
        items.extend(body[key])
        cursor = body["next_cursor"]
        if cursor is None:
            return items, pages
        assert len(body[key]) == limit, "a page before the last must be full"
        assert pages < 10_000, f"paging {url} does not end"


def hash_numbers_in(text: str) -> list[int]:
    """Every JSON number in `text` larger than 2^53: where a block hash would lose precision."""
    found: list[int] = []

    def keep(literal: str) -> int:
        value = int(literal)
        if abs(value) > 2**53:
            found.append(value)
        return value

    json.loads(text, parse_int=keep)
    return found


# -- the direct routes against the whole stack ---------------------------------------------

_POD_A = WorkerKey("pod-a", 0)
_POD_B = WorkerKey("pod-b", 1)
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


async def filled(store: IndexStore | None = None) -> IndexStore:
    """`store` (or a new memory store) holding what CALLS ask for: two workers, sessions s
    and t."""
    store = MemoryStore() if store is None else store
    await store.set_status(_POD_A, WorkerStatus(WorkerState.LIVE, 1.5))
    await store.set_status(_POD_B, WorkerStatus(WorkerState.DEGRADED, 2.0, "gap"))
    await store.apply(_POD_A, Batch(0, 10.0, [EntriesStored([1, 2, BIG[0]], "GPU", 0, "s", 16)]))
    await store.apply(_POD_B, Batch(0, 11.0, [EntriesStored([1, 5], "CPU", 0, "s")]))
    await store.apply(_POD_B, Batch(1, 12.0, [EntriesStored([7], "GPU", 0, "t")]))
    return store


class BrokenStore(MemoryStore):
    """Every read the hot requests make fails, as a store outage does."""

    async def get_session(self, session_id: str) -> Any:
        raise ConnectionError("store down")

    async def worker_states(self) -> Any:
        raise ConnectionError("store down")


def direct_and_plain(store: IndexStore, tokens: bool) -> tuple[FastAPI, FastAPI]:
    """The app over `store` and the same app without its direct routes: the two the direct
    tests compare (with TOKEN required when `tokens`)."""
    required = (TOKEN,) if tokens else ()
    direct = create_app(store, tokens=required, max_body_bytes=256)
    plain = create_app(store, tokens=required, max_body_bytes=256, direct_routes=False)
    return direct, plain


def all_headers(response: httpx.Response) -> list[tuple[str, str]]:
    return response.headers.multi_items()


async def same_answers(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient],
    calls: list[Call],
    headers: Callable[[httpx.Response], list[tuple[str, str]]] = all_headers,
) -> None:
    """Each of `calls` gets the same status, `headers` and body from both clients (the direct
    server's first)."""
    direct, plain = clients
    for method, path, kwargs in calls:
        got = await direct.request(method, path, **kwargs)
        want = await plain.request(method, path, **kwargs)
        where = f"{method} {path} {kwargs}"[:200]
        assert got.status_code == want.status_code, where
        assert headers(got) == headers(want), where
        assert got.content == want.content, where
