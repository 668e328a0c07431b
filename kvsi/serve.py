"""Wiring: store, streams, simulated fleet and HTTP API in one process, started and stopped.

The only module that knows every part; each part knows only the store contract.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import uvicorn

from api.app import create_app
from kvsi.janitor import run_gc_freezer, run_janitor
from kvsi.settings import Settings, bearer_tokens
from store.base import IndexStore
from store.select import open_store
from subscriber.pool import StreamPool
from subscriber.stream import IngestOptions, PublisherSpec

log = structlog.get_logger(__name__)


def publisher_specs(settings: Settings) -> list[PublisherSpec]:
    """The configured publishers as stream specs (the global topic fills in gaps)."""
    return [
        PublisherSpec(
            pod=p.pod,
            endpoint=p.endpoint,
            replay_endpoint=p.replay_endpoint,
            dp_rank=p.dp_rank,
            topic=settings.topic if p.topic is None else p.topic,
        )
        for p in settings.publishers
    ]


def ingest_options(settings: Settings) -> IngestOptions:
    """The ingest bounds the settings name."""
    return IngestOptions(
        queue_size=settings.ingest_queue_size,
        replay_timeout=settings.replay_timeout_seconds,
        replay_attempts=settings.replay_attempts,
        max_concurrent_replays=settings.max_concurrent_replays,
        unconfirmed_ttl=settings.unconfirmed_ttl_seconds,
        store_retry_max=settings.store_retry_max_seconds,
        index_audit=settings.index_audit_seconds,
    )


def readiness_probe(
    store: IndexStore, pool: StreamPool | None = None
) -> Callable[[], Awaitable[list[str]]]:
    """Not ready while the store cannot answer, or while ingest is buffering for it or
    repairing batches a full queue dropped (`StreamPool.readiness_reasons`)."""

    async def reasons() -> list[str]:
        found = [] if pool is None else pool.readiness_reasons()
        try:
            await store.list_workers()
        except Exception as exc:  # any store failure means not ready; the reason says which
            found.insert(0, f"index store unavailable: {exc}")
        return found

    return reasons


async def run_service(settings: Settings, *, on_ready: Callable[[str], None] | None = None) -> None:
    """Run until cancelled (Ctrl-C): ingest and/or API as the settings say."""
    store = open_store(settings.store)
    specs = publisher_specs(settings)
    tasks: list[asyncio.Task[Any]] = []
    fleet = None
    if settings.demo:
        from simulator.fleet import SimulatedFleet  # only the demo needs the simulator

        fleet = SimulatedFleet(
            pods=settings.demo_pods, base_port=settings.demo_base_port, sessions=40
        )
        await fleet.start()
        specs += [
            PublisherSpec(pod=pod, endpoint=pub, replay_endpoint=replay, topic=settings.topic)
            for pod, pub, replay in fleet.endpoints()
        ]
    pool = StreamPool(specs, store, ingest_options(settings)) if settings.ingest else None
    if pool is not None:
        await pool.start()
    if fleet is not None:
        tasks.append(fleet.run_in_background(settings.demo_rate))
    tasks.append(
        asyncio.create_task(
            run_janitor(
                store,
                interval=settings.janitor_interval_seconds,
                session_idle=settings.session_idle_seconds,
                worker_grace=settings.worker_grace_seconds,
            ),
            name="janitor",
        )
    )
    tasks.append(
        asyncio.create_task(run_gc_freezer(settings.gc_freeze_interval_seconds), name="gc-freezer")
    )
    try:
        if settings.api:
            await _serve_http(settings, store, pool, on_ready)
        else:
            if on_ready is not None:
                on_ready("")
            await asyncio.Event().wait()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if pool is not None:
            await pool.stop()
        if fleet is not None:
            fleet.stop()
            await fleet.close()
        await store.close()


async def _serve_http(
    settings: Settings,
    store: IndexStore,
    pool: StreamPool | None,
    on_ready: Callable[[str], None] | None,
) -> None:
    app = create_app(
        store,
        readiness=readiness_probe(store, pool),
        tokens=bearer_tokens(settings),
        metrics_require_token=settings.metrics_require_token,
    )
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_config=None, lifespan="on"
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(), name="http")
    # uvicorn offers no "started" event to await; poll its flag briefly at start-up.
    while not server.started and not serving.done():  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    if server.started and on_ready is not None:
        sock = server.servers[0].sockets[0].getsockname()
        on_ready(f"http://{sock[0]}:{sock[1]}")
    try:
        await serving
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serving
