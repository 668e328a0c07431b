"""Real `kvsi serve` processes on a real private redis-server, fed by an in-process fleet.

The fleet (simulator.fleet.SimulatedFleet) runs in the test's event loop, so its engines'
truth can be read; each service is a separate `python -m kvsi serve` process configured by
its command line (and `KVSI_*` environment variables for bounds that have no flag), read
only through its HTTP API. Every process logs to a file in a temporary directory that is
shown when a wait fails, and is stopped by whoever started it (see `services`).

Services log JSON (`KVSI_LOG_FORMAT=json`, as a deployment feeding a log shipper would); a
test passes `KVSI_LOG_FORMAT` to choose.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kvsi.simulator.fleet import SimulatedFleet
from tests import waiting
from tests.children import tied
from tests.e2e.truth import listing
from tests.environ import service_environ
from tests.ports import free_port_run
from tests.redis_servers import RedisServer, require

KVSI = [sys.executable, "-m", "kvsi"]
T = TypeVar("T")

KEEP_LOGS = os.environ.get("KVSI_E2E_LOGS")
"""A directory to copy every service's and redis-server's log to (for a flaky run), or None."""

START_WITHIN = 45.0
"""Seconds a `kvsi serve` process gets to serve HTTP (imports are slow on a loaded box)."""

_SERVING = re.compile(r"serving on (http://\S+)")


class Service:
    """One `kvsi serve` process; its output goes to `log`. `file_limit`: its soft and hard
    RLIMIT_NOFILE (None: inherited)."""

    def __init__(
        self,
        name: str,
        args: list[str],
        env: dict[str, str],
        workdir: Path,
        file_limit: int | None = None,
    ) -> None:
        self.name = name
        self.args = args
        self.log = workdir / f"{name}.log"
        self.url = ""
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                tied([*KVSI, *args]),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=service_environ({"PYTHONUNBUFFERED": "1", "COLUMNS": "200"} | env),
                preexec_fn=None if file_limit is None else _limit_files(file_limit),
            )

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        """The last lines of its log, the request log's lines (kvsi's `http.request`, in
        either format) left out: a test polling /metrics would fill the tail with them."""
        kept = [line for line in self.output().splitlines() if "http.request" not in line]
        return f"--- {self.name} (last {lines} lines) ---\n" + "\n".join(kept[-lines:])

    async def serving(self, within: float = START_WITHIN) -> str:
        """Wait for the announced URL (the process was started with `--port 0`)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            found = _SERVING.search(self.output())
            if found:
                self.url = found.group(1)
                return self.url
            if not self.running:
                raise AssertionError(
                    f"{self.name} exited with {self.proc.returncode}\n{self.tail()}"
                )
            await asyncio.sleep(0.05)
        raise AssertionError(f"{self.name} not serving within {within}s\n{self.tail()}")

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a node lost, an OOM kill)."""
        if self.running:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        """Ctrl-C, as an operator stops it; SIGKILL if it does not end within 15 s."""
        if self.running:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def _limit_files(files: int) -> Callable[[], None]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    return limit


class Services:
    """Starts services for one test; `close()` stops every one still running."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[Service] = []
        self.clients: list[httpx.AsyncClient] = []

    def start(
        self,
        name: str,
        store: str,
        fleet: SimulatedFleet | None,
        *extra: str,
        env: dict[str, str] | None = None,
        file_limit: int | None = None,
    ) -> Service:
        """`kvsi serve --store STORE --port 0` with every pod of `fleet` (None: no --pod);
        `file_limit` is its RLIMIT_NOFILE, soft and hard (None: this process's)."""
        args = ["serve", "--store", store, "--host", "127.0.0.1", "--port", "0", *extra]
        for pod, endpoint, replay in fleet.endpoints() if fleet is not None else []:
            args += ["--pod", f"{pod}={endpoint}", "--replay", f"{pod}={replay}"]
        return self.command(name, args, {"KVSI_LOG_FORMAT": "json"} | (env or {}), file_limit)

    def command(
        self, name: str, args: list[str], env: dict[str, str], file_limit: int | None = None
    ) -> Service:
        """`kvsi ARGS` exactly as given (a shipped command line), `env` over this process's."""
        service = Service(name, args, env, self.workdir, file_limit)
        self.started.append(service)
        return service

    async def client(self, service: Service) -> httpx.AsyncClient:
        """An HTTP client of the service, once it serves."""
        client = httpx.AsyncClient(base_url=await service.serving(), timeout=10.0)
        self.clients.append(client)
        return client

    def logs(self) -> str:
        return "\n".join(s.tail() for s in self.started)

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()
        for service in self.started:
            service.stop()


@asynccontextmanager
async def services() -> AsyncIterator[Services]:
    """Services in a temporary directory; all stopped and the directory removed after."""
    workdir = Path(tempfile.mkdtemp(prefix="kvsi-e2e-"))
    running = Services(workdir)
    try:
        yield running
    finally:
        try:
            await running.close()
        finally:
            for service in running.started:
                keep(service.log, service.name)
            shutil.rmtree(workdir, ignore_errors=True)


@asynccontextmanager
async def fleet_of(**options: Any) -> AsyncIterator[SimulatedFleet]:
    """A started fleet on free loopback ports with its own zmq context (sized for its
    workers), closed after."""
    fleet = SimulatedFleet(**options)
    try:
        await fleet.start()
        yield fleet
    finally:
        fleet.stop()
        await fleet.close()


# -- redis-server --------------------------------------------------------------------------


PERSISTENT = ("--appendonly", "yes", "--appendfsync", "always")
"""AOF on, fsync per write, RDB off (`--save ""` comes first): a restart keeps the data."""


def start_redis(*args: str) -> RedisServer:
    """A private redis-server on a free port below the ephemeral range.

    Below it, no outgoing connection (the services' own, while the server is down) can take
    the port, so a test can stop the server and start it again on the same port.
    """
    require("redis-server")
    server = RedisServer(*args)
    for attempt in range(3):
        try:
            server.start(free_port_run(1))
            return server
        except RuntimeError:
            if attempt == 2:
                server.remove()
                raise
    raise AssertionError("unreachable")


@contextmanager
def redis_server(*args: str) -> Iterator[RedisServer]:
    server = start_redis(*args)
    try:
        yield server
    finally:
        server.stop()
        keep(server.dir / "redis.log", f"redis-{server.port}")
        server.remove()


def keep(log: Path, name: str) -> None:
    """Copy `log` to KVSI_E2E_LOGS, if set, under a name that does not clash."""
    if KEEP_LOGS and log.exists():
        Path(KEEP_LOGS).mkdir(parents=True, exist_ok=True)
        shutil.copy(
            log, Path(KEEP_LOGS) / f"{time.strftime('%H%M%S')}-{name}-{uuid.uuid4().hex[:4]}.log"
        )


def store_url(server: RedisServer, prefix: str) -> str:
    """The service's `--store`: the server, a prefix, bounded socket waits."""
    return (
        f"redis://127.0.0.1:{server.port}/0?prefix={prefix}"
        "&socket_timeout=5&socket_connect_timeout=2"
    )


def unique_prefix() -> str:
    return f"e2e-{uuid.uuid4().hex[:10]}"


# -- a sidecar on a private redis-server ---------------------------------------------------


FAST_RETRY = {"KVSI_STORE_RETRY_MAX_SECONDS": "0.25"}
"""Ingest retries the store at most 0.25 s apart (default 2 s): recovery shows sooner."""


class Sidecar(NamedTuple):
    """What `sidecar_on_redis` started, in the order a test unpacks it."""

    redis: RedisServer
    fleet: SimulatedFleet
    run: Services
    service: Service
    client: httpx.AsyncClient


@asynccontextmanager
async def sidecar_on_redis(
    fleet: dict[str, Any], env: dict[str, str], warm: int, *redis_args: str, rate: float
) -> AsyncIterator[Sidecar]:
    """A `kvsi serve` sidecar (environment `env`) on a private redis-server (`redis_args`)
    under a fresh prefix, indexing a fleet (`fleet`: its options), with a client once
    `warm` ticks at `rate` are applied; all stopped after."""
    with redis_server(*redis_args) as redis:
        async with fleet_of(**fleet) as started, services() as run:
            service = run.start("sidecar", store_url(redis, unique_prefix()), started, env=env)
            client = await warmed_up(run, service, started, rate, warm)
            yield Sidecar(redis, started, run, service, client)


# -- waiting and reading -------------------------------------------------------------------


async def until(
    check: Callable[[], Awaitable[T | None]], within: float, what: str, logs: Services | None
) -> T:
    """`tests.waiting.until` for a service: one that does not answer (connection refused, a
    503) reads as not yet, and a failure shows the services' logs."""
    return await waiting.until(
        check,
        within,
        what,
        tolerate=(httpx.TransportError, httpx.HTTPStatusError),
        context=str if logs is None else logs.logs,
        every=0.1,
    )


async def pods(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    response = await client.get("/v1/pods")
    response.raise_for_status()
    return {p["pod"]: p for p in response.json()["pods"]}


async def all_live(client: httpx.AsyncClient, fleet: SimulatedFleet) -> bool:
    found = await pods(client)
    return set(found) == set(fleet.pods) and all(p["state"] == "live" for p in found.values())


async def caught_up(client: httpx.AsyncClient, fleet: SimulatedFleet) -> bool:
    """Every pod's last applied seq is the last its publisher sent."""
    found = await pods(client)
    return all(
        pod in found and found[pod]["last_seq"] == fleet.publisher(pod).next_seq - 1
        for pod in fleet.pods
    )


async def warmed_up(
    run: Services, service: Service, fleet: SimulatedFleet, rate: float, batches: int
) -> httpx.AsyncClient:
    """A client of `service` once every pod is live and `batches` ticks are applied."""
    client = await run.client(service)
    await until(lambda: all_live(client, fleet), 30, "pods live", run)
    await fleet.run(rate, max_batches=batches)
    await until(lambda: caught_up(client, fleet), 30, "caught up", run)
    return client


async def outage_reported(client: Any, fleet: SimulatedFleet, buffered: bool) -> list[str] | None:
    """/readyz's reasons once it says the store is down (and, if `buffered`, that each
    worker has batches buffered for it)."""
    status, reasons = await readiness(client)
    if status != 503 or not reasons or not reasons[0].startswith("index store unavailable"):
        return None
    held = [r for r in reasons if "buffered during the index store outage" in r]
    if buffered and len(held) < len(fleet.pods):
        return None
    return reasons


async def readiness(client: httpx.AsyncClient) -> tuple[int, list[str]]:
    response = await client.get("/readyz")
    reasons: list[str] = response.json().get("reasons", [])
    return response.status_code, reasons


async def ready(client: httpx.AsyncClient) -> bool:
    """/readyz says ready, with no reason against."""
    return await readiness(client) == (200, [])


async def burst(client: httpx.AsyncClient, fleet: SimulatedFleet, n: int = 16) -> list[str]:
    """`n` concurrent reads of the pods' blocks; the answers that were not 200."""
    responses = await asyncio.gather(
        *(
            client.get(f"/v1/pods/{fleet.pods[i % len(fleet.pods)]}/blocks", params={"limit": "1"})
            for i in range(n)
        )
    )
    return [f"{r.status_code} {r.text[:120]}" for r in responses if r.status_code != 200]


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""/metrics as {(name, sorted labels): value}."""


async def metrics(client: httpx.AsyncClient) -> Samples:
    """Every sample of /metrics, keyed by (name, sorted labels)."""
    response = await client.get("/metrics")
    response.raise_for_status()
    out: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def per_worker(samples: Samples, name: str, pod: str, **labels: str) -> float:
    """One per-worker sample (worker `pod/0`), 0 when absent (a counter never incremented)."""
    key = tuple(sorted({"worker": f"{pod}/0", **labels}.items()))
    return samples.get((name, key), 0.0)


STREAM_FIELDS = frozenset(
    ("state_since", "last_event_at", "gaps", "replays", "restarts", "lag_batches", "lag_seconds")
)
"""/v1/pods fields of the writing process's stream, not of the index: its clock, what its
own subscription met (two processes on one fleet may see different gaps), and its lag as
last stored (refreshed at least every audit, so a snapshot taken right after catching up
may still show the lag of the last write during traffic)."""


async def snapshot(client: httpx.AsyncClient, pod_names: list[str]) -> dict[str, Any]:
    """Everything the API tells about the index, minus what belongs to the process that
    wrote it (`STREAM_FIELDS`); engine times (`last_seen`) are kept: every process must
    store the same ones.
    """
    listed = await pods(client)
    out: dict[str, Any] = {
        "pods": {
            pod: {k: v for k, v in p.items() if k not in STREAM_FIELDS} for pod, p in listed.items()
        }
    }
    for pod in pod_names:
        out[f"blocks:{pod}"] = sorted(map(str, await listing(client, f"/v1/pods/{pod}/blocks")))
    sessions: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"limit": "7"} | ({"cursor": cursor} if cursor else {})  # small pages: cursors
        response = await client.get("/v1/sessions", params=params)
        response.raise_for_status()
        body = response.json()
        sessions.extend(body["sessions"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    out["sessions"] = sessions
    for summary in sessions:
        sid = summary["session_id"]
        view = (await client.get(f"/v1/sessions/{sid}")).json()
        for pod in view.get("pods", []):
            pod.pop("state", None)  # the stream's state, not the index
        out[f"view:{sid}"] = view
        for pod in pod_names:
            blocks = await listing(client, f"/v1/sessions/{sid}/blocks", pod=pod)
            out[f"blocks:{sid}:{pod}"] = sorted(map(str, blocks))
    return out


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Keys of two snapshots that differ (a readable assertion message)."""
    return [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
