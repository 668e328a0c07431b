"""Wiring: store, streams, simulated fleet and HTTP API in one process, started and stopped.

The only module that knows every part; each part knows only the store contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import structlog
import uvicorn
from fastapi import FastAPI

from kvsi import metrics
from kvsi.api.app import create_app, create_probe_app, stop_streams
from kvsi.api.direct import direct_server
from kvsi.api.routers.dynamo import DynamoOptions, create_dynamo_app
from kvsi.api.routers.llm_d.hints import HintOptions
from kvsi.dynamo_follow import follow_registrations
from kvsi.errors import StartupError
from kvsi.http import serving_protocol
from kvsi.janitor import run_gc_freezer, run_janitor
from kvsi.loops import loop_name
from kvsi.settings import DiscoveryConfig, Settings, bearer_tokens
from kvsi.store.base import IndexReader, IndexStore, PooledStore
from kvsi.store.model import WorkerKey
from kvsi.store.select import StoreURLError, masked, open_roster, open_store
from kvsi.subscriber.pool import StreamPool
from kvsi.subscriber.stream import IngestOptions, PublisherSpec
from kvsi.version import core_build, package_version

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
            model=p.model,
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
        max_workers=settings.max_workers,
        tokens_hashes=settings.dynamo_api,
    )


def readiness_probe(
    store: IndexReader, pool: StreamPool | None = None
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
    build = {"version": package_version(), "core": core_build()}
    metrics.BUILD.info(build)
    log.info(
        "serve.start",
        **build,
        store=masked(settings.store),
        ingest=settings.ingest,
        api=settings.api,
        event_loop=loop_name(),
        thread_switch_seconds=sys.getswitchinterval(),
    )
    if build["core"] != "native":
        log.warning(
            "serve.interpreted_core",
            detail="the index core runs interpreted (installed without a C compiler, or with "
            "KVSI_PURE_PYTHON): the same answers at a lower ingest rate",
        )
    try:
        store = open_store(settings.store)
    except StoreURLError as exc:
        raise StartupError(str(exc)) from exc
    await warn_if_unreachable(store, settings.store)
    specs = publisher_specs(settings)
    tasks: list[asyncio.Task[Any]] = []
    fleet = None
    if settings.demo:
        # Only the demo needs the simulator.
        from kvsi.simulator.fleet import FleetBindError, SimulatedFleet

        fleet = SimulatedFleet(
            pods=settings.demo_pods,
            base_port=settings.demo_base_port,
            sessions=40,
            session_idle=settings.session_idle_seconds,
            buffer_steps=DEMO_BUFFER_STEPS,
        )
        try:
            await fleet.start()
        except FleetBindError as exc:
            raise StartupError(f"the demo's {exc}") from exc
        specs += [
            PublisherSpec(pod=pod, endpoint=pub, replay_endpoint=replay, topic=settings.topic)
            for pod, pub, replay in fleet.endpoints()
        ]
    pool = StreamPool(specs, store, ingest_options(settings)) if settings.ingest else None
    if pool is not None:
        await pool.start()
        if settings.discovery is not None:
            tasks.append(_start_discovery(settings.discovery, settings, pool))
        if settings.dynamo_api:
            follower = follow_registrations(
                store, pool, topic=settings.topic, interval=settings.dynamo.follow_seconds
            )
            tasks.append(asyncio.create_task(follower, name="dynamo-follow"))
    if fleet is not None:
        tasks.append(fleet.run_in_background(settings.demo_rate))
    if settings.api:
        tasks.append(
            asyncio.create_task(
                run_index_metrics(store, settings.index_metrics_interval_seconds),
                name="index-metrics",
            )
        )
    tasks.append(
        asyncio.create_task(
            run_janitor(
                store,
                interval=settings.janitor_interval_seconds,
                session_idle=settings.session_idle_seconds,
                worker_grace=settings.worker_grace_seconds,
                # An ingest-only sidecar sweeps what it writes; API replicas sweep the rest.
                written_only=not settings.api,
            ),
            name="janitor",
        )
    )
    tasks.append(
        asyncio.create_task(run_gc_freezer(settings.gc_freeze_interval_seconds), name="gc-freezer")
    )
    tasks.append(asyncio.create_task(metrics.watch_loop_lag(), name="loop-lag"))
    # The memory store has no pool: no series (and none left from a store before it).
    metrics.CONNECTION_WAITS.follow(
        store.connection_waits if isinstance(store, PooledStore) else None
    )
    try:
        if settings.api:
            await _serve_api(settings, store, pool, on_ready)
        elif settings.metrics_port is not None:
            probes = create_probe_app(readiness=readiness_probe(store, pool))
            await _serve_http(probes, settings.host, settings.metrics_port, _probes_ready(on_ready))
        else:
            if on_ready is not None:
                on_ready("")
            await asyncio.Event().wait()
    finally:
        metrics.CONNECTION_WAITS.follow(None)  # first: nothing below may leave it pointing here
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if pool is not None:
            await pool.stop()
        if fleet is not None:
            fleet.stop()
            await fleet.close()
        await store.close()


HTTP_GRACE_SECONDS = 3
"""How long a stopping HTTP server waits for requests still in flight before it cancels
them: well inside Kubernetes' 30 s grace period, longer than any request but a stream."""

DEMO_BUFFER_STEPS = 1_000
"""Batches each demo pod keeps for replay: enough to repair a gap, where vLLM's default
(10,000 batches, each carrying its blocks' token ids) would make a long-running demo's
memory climb for many minutes before it levels off."""

STORE_CHECK_SECONDS = 3.0
"""How long the start-up check waits for the store before saying it is unreachable."""


async def warn_if_unreachable(store: IndexReader, url: str) -> None:
    """One warning line at start when the store does not answer; the service starts anyway
    (the API answers 503 and ingest holds its batches until the store is back)."""
    try:
        async with asyncio.timeout(STORE_CHECK_SECONDS):
            await store.list_workers()
    except Exception as exc:  # any failure: the line names it, the service goes on
        log.warning(
            "store.unreachable",
            store=masked(url),
            error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__,
            meanwhile="the API answers 503 and ingest holds its batches until it answers",
        )


def _start_discovery(
    config: DiscoveryConfig, settings: Settings, pool: StreamPool
) -> asyncio.Task[None]:
    """Central mode's discovery loop; the Kubernetes client (and with discovery.split, the
    replicas' roster) is made here, so a missing configuration stops the service at start."""
    from kvsi.discovery import open_kube_client, run_discovery, watch_pods

    source = watch_pods(open_kube_client(config), config)
    try:
        roster = open_roster(settings.store) if config.split else None
    except StoreURLError as exc:
        raise StartupError(f"discovery.split: {exc}") from exc
    if roster is not None:
        log.info("discovery.split", replica=config.replica_id, beat_seconds=config.beat_seconds)
    run = run_discovery(config, pool, source, topic=settings.topic, roster=roster)
    return asyncio.create_task(run, name="discovery")


async def run_index_metrics(store: IndexReader, interval: float) -> None:
    """`refresh_index_metrics` every `interval` seconds until cancelled; a store outage keeps
    the last numbers (kvsi_store_available says why they are old)."""
    while True:
        try:
            await refresh_index_metrics(store)
        except Exception as exc:  # an outage must not end the refresher
            log.debug("index_metrics.skipped", error=f"{type(exc).__name__}: {exc}")
        await asyncio.sleep(interval)


async def refresh_index_metrics(store: IndexReader) -> None:
    """The index size and loss gauges from the store. The reads go a chunk of workers a
    round trip and the gauges are built in a thread: at fleet size, thousands of samples
    would hold the event loop (bench/README.md, api_background.py)."""
    workers = await store.list_workers()
    losses = await store.worker_losses()
    sizes = [(str(WorkerKey(w.pod, w.dp_rank)), w.sessions, w.blocks) for w in workers]
    hurt = [(str(w), x.sessions_hurt, x.lost_blocks, x.reprefill_tokens) for w, x in losses.items()]
    await asyncio.to_thread(metrics.INDEX.update, sizes, hurt)


def _api_app(settings: Settings, store: IndexStore, pool: StreamPool | None) -> FastAPI:
    app = create_app(
        store,
        readiness=readiness_probe(store, pool),
        tokens=bearer_tokens(settings),
        metrics_require_token=settings.metrics_require_token,
        hint_options=hint_options(settings),
        max_body_bytes=settings.max_body_bytes,
        access_log=settings.access_log,
    )
    if settings.dynamo_api:
        app.mount(settings.dynamo.prefix, dynamo_app(settings, store))
    return app


def hint_options(settings: Settings) -> HintOptions:
    """How session hints name llm-d endpoints, as the settings `llm_d` say."""
    config = settings.llm_d
    return HintOptions(
        namespace=config.namespace,
        pod_namespaces=config.pod_namespaces,
        endpoint=config.endpoint,
        header=config.header,
        label_header=config.label_header,
    )


def dynamo_app(settings: Settings, store: IndexStore) -> FastAPI:
    """Dynamo's standalone indexer API over `store`, as the settings configure it."""
    config = settings.dynamo
    options = DynamoOptions(dump_limit=config.dump_limit)
    return create_dynamo_app(
        store, options, tokens=bearer_tokens(settings), max_body_bytes=settings.max_body_bytes
    )


async def _serve_api(
    settings: Settings,
    store: IndexStore,
    pool: StreamPool | None,
    on_ready: Callable[[str], None] | None,
) -> None:
    """The REST API, and Dynamo's on its own port if configured: one failing (a port in
    use) stops the other, so the service never runs half of what it was asked to."""
    main = _serve_http(_api_app(settings, store, pool), settings.host, settings.port, on_ready)
    port = settings.dynamo.port
    if not settings.dynamo_api or port is None:
        await main
        return
    servers = [
        asyncio.create_task(main, name="http"),
        asyncio.create_task(
            _serve_http(dynamo_app(settings, store), settings.host, port, _dynamo_ready),
            name="dynamo-http",
        ),
    ]
    try:
        done, _ = await asyncio.wait(servers, return_when=asyncio.FIRST_COMPLETED)
        for server in done:
            server.result()
    finally:
        for server in servers:
            server.cancel()
        await asyncio.gather(*servers, return_exceptions=True)


def _dynamo_ready(url: str) -> None:
    log.info("serve.dynamo", url=url)


def _probes_ready(on_ready: Callable[[str], None] | None) -> Callable[[str], None]:
    """Log where an ingest-only process serves its probes; tell the caller it serves no API."""

    def ready(url: str) -> None:
        log.info("serve.probes", url=url, paths=["/healthz", "/readyz", "/metrics"])
        if on_ready is not None:
            on_ready("")

    return ready


class _Server(uvicorn.Server):
    """uvicorn without signal handlers of its own: the process's (`kvsi.cli`'s) stop the
    whole service in order, HTTP included. uvicorn's replace them while it serves and raise
    the signal again once it is done, which would land in the middle of that cleanup.
    `on_ready` gets the URL as soon as the socket listens, before any request is handled
    (uvicorn offers no event to await)."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[str], None] | None) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self._on_ready is not None:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            self._on_ready(f"http://{host}:{port}")


def listen(host: str, port: int) -> socket.socket:
    """A bound TCP socket for the HTTP server; StartupError says why not (a port in use)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError as exc:
        raise StartupError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    return sock


async def _serve_http(
    app: FastAPI, host: str, port: int, on_ready: Callable[[str], None] | None
) -> None:
    # Requests are logged by the app's RequestMetrics (with route, session, pod), not uvicorn.
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        lifespan="on",
        access_log=False,
        timeout_graceful_shutdown=HTTP_GRACE_SECONDS,
        # The hot requests straight from the protocol, where the app offers it (api/direct.py).
        http=serving_protocol(direct_server(app)),
    )
    server = _Server(config, on_ready)
    serving = asyncio.create_task(server.serve(sockets=[listen(host, port)]), name="http")
    try:
        # Waited on, not awaited: cancelling this coroutine (the service stopping) must not
        # cancel uvicorn mid-request; should_exit below lets it finish and shut down itself.
        await asyncio.wait([serving])
        serving.result()
    finally:
        stop_streams(app)
        server.should_exit = True
        await asyncio.wait([serving])
