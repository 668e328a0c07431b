"""The store's connection waits in a served `/metrics` (kvsi/serve.py wires the store to
kvsi/metrics.py's collector): counted on a Redis store whose pool is too small for the
requests in flight, absent on the memory store, which has no pool."""

from __future__ import annotations

import asyncio
import uuid

import httpx
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from kvsi.serve import run_service
from kvsi.settings import Settings
from tests.redis_servers import RedisServer, redis_server  # noqa: F401  (fixture)

REQUESTS = 200
"""Session reads sent at once: far more than the store's connections."""
CONNECTIONS = 2
"""The store's pool, the fewest a URL may ask for: the read scripts hold none of them (half
less one), so every read takes the pool and any two at once make one wait."""
WAITS = ("kvsi_store_connection_waits_total", "kvsi_store_connection_wait_seconds_total")


async def served_metrics(settings: Settings, requests: int = 0) -> dict[str, float]:
    """`requests` session reads at once on `kvsi serve`, then its `/metrics` samples."""
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    service = asyncio.create_task(run_service(settings, on_ready=ready.set_result))
    try:
        base = await asyncio.wait_for(ready, 30)
        limits = httpx.Limits(max_connections=requests or 1)
        async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
            answers = await asyncio.gather(
                *(client.get(f"/v1/sessions/s-{i}") for i in range(requests))
            )
            assert {a.status_code for a in answers} <= {404}
            text = (await client.get("/metrics")).text
    finally:
        service.cancel()
        await asyncio.gather(service, return_exceptions=True)
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_a_redis_stores_connection_waits_show_in_metrics(
    redis_server: RedisServer,  # noqa: F811
) -> None:
    url = f"{redis_server.url}?max_connections={CONNECTIONS}&prefix=t-{uuid.uuid4().hex[:12]}"
    settings = Settings(port=0, store=url, ingest=False)

    samples = await served_metrics(settings, REQUESTS)

    waits, seconds = (samples[name] for name in WAITS)
    assert waits > 0
    assert seconds > 0
    assert REGISTRY.get_sample_value(WAITS[0]) is None  # the service ended: its store is gone


async def test_the_memory_store_exports_no_connection_waits() -> None:
    samples = await served_metrics(Settings(port=0), requests=1)

    assert not set(WAITS) & samples.keys()
