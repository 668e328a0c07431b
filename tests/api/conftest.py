"""Fixtures for the API tests: a real MemoryStore behind the real app, over ASGI.

Imports neither zmq nor subscriber/: the API must work without them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from kvsi.store.memory import MemoryStore
from tests.api.harness import Feed, client_over


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
def feed(store: MemoryStore) -> Feed:
    return Feed(store)


@pytest.fixture
async def client(store: MemoryStore) -> AsyncIterator[httpx.AsyncClient]:
    async with client_over(store) as c:
        yield c
