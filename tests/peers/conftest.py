"""The peers tier's fixtures: Dynamo's interpreter and kvsi's store per backend."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.peers.dynamo import require_peer
from tests.redis_servers import redis_cluster, redis_server  # noqa: F401  (fixtures)


@pytest.fixture
def peer() -> Path:
    return require_peer()


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("cluster", marks=[pytest.mark.redis, pytest.mark.cluster]),
    ]
)
def store_url(request: pytest.FixtureRequest) -> str:
    """`kvsi serve --store` of one backend, its own key prefix on a shared server."""
    if request.param == "memory":
        return "memory"
    server = request.getfixturevalue(
        "redis_server" if request.param == "redis" else "redis_cluster"
    )
    return f"{server.url}?prefix=peers-{uuid.uuid4().hex[:10]}"
