"""Fixtures for the Redis store's own tests: real servers, fresh prefixes, raw clients.

The servers come from tests/redis_servers.py (skipped without the binaries unless CI is set).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import redis

from kvsi.store.redis import RedisStore
from tests.redis_servers import RedisServer, redis_cluster, redis_server  # noqa: F401

MakeStore = Callable[..., Awaitable[RedisStore]]


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def raw(redis_server: RedisServer) -> redis.Redis:  # noqa: F811
    """A plain synchronous client on the standalone server, to look at what the store wrote."""
    return redis_server.client()


@pytest.fixture(params=["redis", pytest.param("cluster", marks=pytest.mark.cluster)])
def server_url(request: pytest.FixtureRequest) -> str:
    """The standalone server, then the cluster: for tests that must hold on both."""
    name = "redis_server" if request.param == "redis" else "redis_cluster"
    url: str = request.getfixturevalue(name).url
    return url


@pytest.fixture
async def make_store(redis_server: RedisServer, prefix: str) -> AsyncIterator[MakeStore]:  # noqa: F811
    """Stores on the standalone server sharing `prefix` (so they see one index), closed after."""
    made: list[RedisStore] = []

    async def make(url: str | None = None, **options: str) -> RedisStore:
        """A store; `options` are URL options, e.g. another `prefix` for another index."""
        query = "&".join(
            f"{k}={v}" for k, v in {"prefix": prefix, "registry_ttl": "0", **options}.items()
        )
        store = RedisStore.from_url(f"{url or redis_server.url}?{query}")
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()
