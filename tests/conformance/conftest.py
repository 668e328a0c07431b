"""The `store` fixture: one conformance suite, run against every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from store.base import IndexStore
from store.memory import MemoryStore

StoreFactory = Callable[[], Awaitable[IndexStore]]


@pytest.fixture(params=["memory"])
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[StoreFactory]:
    """A factory of fresh, empty stores of one backend; closes them all afterwards."""
    made: list[IndexStore] = []

    async def make() -> IndexStore:
        store: IndexStore = MemoryStore()
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


@pytest.fixture
async def store(make_store: StoreFactory) -> IndexStore:
    return await make_store()
