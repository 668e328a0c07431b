"""Liveness and readiness probes: readiness reasons, failures and timeouts become a 503."""

from __future__ import annotations

import asyncio

from kvsi.api import create_app
from kvsi.store.memory import MemoryStore
from tests.api.harness import client_for, get_json


async def test_healthz_is_ok() -> None:
    async with client_for(create_app(MemoryStore())) as client:
        assert await get_json(client, "/healthz") == {"status": "ok"}


async def test_ready_without_a_readiness_check() -> None:
    async with client_for(create_app(MemoryStore())) as client:
        assert await get_json(client, "/readyz") == {"status": "ready"}


async def test_ready_when_the_check_has_no_reasons() -> None:
    calls: list[int] = []

    async def ready() -> list[str]:
        calls.append(1)
        return []

    async with client_for(create_app(MemoryStore(), readiness=ready)) as client:
        assert await get_json(client, "/readyz") == {"status": "ready"}
    assert calls == [1]


async def test_not_ready_is_503_with_the_reasons() -> None:
    async def not_yet() -> list[str]:
        return ["worker vllm-0/0 connecting", "store unreachable"]

    async with client_for(create_app(MemoryStore(), readiness=not_yet)) as client:
        body = await get_json(client, "/readyz", status=503)

    assert body == {
        "status": "not ready",
        "reasons": ["worker vllm-0/0 connecting", "store unreachable"],
    }


async def test_a_failing_check_is_not_ready_with_its_error() -> None:
    async def broken() -> list[str]:
        raise ConnectionError("redis down")

    async with client_for(create_app(MemoryStore(), readiness=broken)) as client:
        body = await get_json(client, "/readyz", status=503)

    assert body["reasons"] == ["readiness check failed: ConnectionError: redis down"]


async def test_a_hung_check_is_not_ready_after_the_timeout() -> None:
    async def hung() -> list[str]:
        await asyncio.sleep(60)
        return []

    app = create_app(MemoryStore(), readiness=hung, readiness_timeout=0.05)
    async with client_for(app) as client:
        body = await asyncio.wait_for(get_json(client, "/readyz", status=503), timeout=5)

    assert body == {"status": "not ready", "reasons": ["readiness check timed out after 0.05s"]}


async def test_metrics_are_served_in_prometheus_format() -> None:
    # Registers the service's metrics, and ingest's (kvsi_apply_seconds among them).
    import kvsi.metrics
    import kvsi.subscriber.metrics  # noqa: F401

    async with client_for(create_app(MemoryStore())) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "kvsi_apply_seconds" in response.text
