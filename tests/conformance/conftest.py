"""The `store` fixture: one conformance suite, run against every backend.

`redis` runs against a standalone redis-server, `cluster` against a real 3-master Redis
Cluster, both started for the session by tests/redis_servers.py (skipped without the
binaries unless CI is set). Every store gets its own key prefix, so stores never see each
other's keys on the shared server.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from kvsi.store.base import IndexStore
from kvsi.store.memory import MemoryStore
from kvsi.store.select import open_store
from tests.redis_servers import redis_cluster, redis_server  # noqa: F401  (fixtures)

StoreFactory = Callable[[], Awaitable[IndexStore]]


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=[pytest.mark.redis, pytest.mark.cluster]),
    ]
)
async def make_store(request: pytest.FixtureRequest) -> AsyncIterator[StoreFactory]:
    """A factory of fresh, empty stores of one backend; closes them all afterwards."""
    made: list[IndexStore] = []
    url = ""
    if request.param == "redis":
        url = request.getfixturevalue("redis_server").url
    elif request.param == "cluster":
        url = request.getfixturevalue("redis_cluster").url

    async def make() -> IndexStore:
        fresh = f"{url}?prefix=t-{uuid.uuid4().hex[:12]}"  # its own index on the server
        store = open_store(fresh) if url else MemoryStore()
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


@pytest.fixture
async def store(make_store: StoreFactory) -> IndexStore:
    return await make_store()
