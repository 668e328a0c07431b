"""Helpers shared by the API tests: feeding a store in order, reading pages, JSON checks.

Imports neither zmq nor subscriber/.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from fastapi import FastAPI

from kvsi.api import create_app
from kvsi.store.base import IndexStore
from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, StoreEvent, WorkerKey

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
