"""How long does a stream take to recover the batches its publisher buffered before it
started (a sidecar restarted behind a busy engine), on the memory store and on Redis?

Run: `.venv/bin/python bench/replay_recovery.py [--batches 10000] [--runs 3] [--redis
standalone|cluster|both] [--no-memory]` (see bench/README.md). In this process, over
loopback TCP: one simulated vLLM publisher (vLLM 0.33's frames, PUB + replay ROUTER, a
buffer of `--batches`) publishes `--batches` of ingest_memory.py's `agentic` payloads before
any subscriber exists, so all of them reach the stream by replay; then one `WorkerStream`
(through a `StreamPool`, as `kvsi serve` runs it) starts on a fresh store, and the clock
runs from its start until the store's fence names the last seq. Redis: a private
redis-server (ingest_redis.py's), and/or a private 3-master Redis Cluster
(tests/redis_servers.py's, as fleet_latency.py starts it), flushed between runs. Prints
seconds per run with Redis' own share (the servers' CPU, and the apply script's time from
`INFO commandstats`), and the medians per store.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import redis
from ingest_memory import agentic, block_events
from ingest_redis import redis_server

from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.store.base import IndexStore
from kvsi.store.memory import MemoryStore
from kvsi.store.model import WorkerKey
from kvsi.store.redis import RedisStore
from kvsi.subscriber.pool import StreamPool
from kvsi.subscriber.stream import PublisherSpec

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.redis_servers import RedisClusterServers  # noqa: E402

WORKER = WorkerKey("bench", 0)


@contextlib.asynccontextmanager
async def buffered_inline(payloads: list[bytes]) -> AsyncIterator[PublisherSpec]:
    """A publisher in this process (its replay served by this event loop), all of `payloads`
    published and buffered."""
    publisher = SimulatedPublisher(
        "tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        pod=WORKER.pod,
        buffer_steps=len(payloads),
    )
    await publisher.start()
    try:
        for payload in payloads:
            await publisher.publish_payload(payload)
        yield PublisherSpec(WORKER.pod, publisher.endpoint, publisher.replay_endpoint)
    finally:
        await publisher.close()


@contextlib.asynccontextmanager
async def buffered_apart(saved: Path) -> AsyncIterator[PublisherSpec]:
    """A publisher in a process of its own (as an engine's is), all of the payloads saved
    in `saved` published and buffered."""
    argv = [sys.executable, __file__, "publish", str(saved)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # noqa: ASYNC220
    try:
        assert proc.stdout is not None
        line = b""
        while not line.startswith(b"publishing "):  # past the child's log lines
            line = await asyncio.to_thread(proc.stdout.readline)
            if not line:
                raise RuntimeError("the publisher process ended before it published")
        _, endpoint, replay = line.decode().split()
        yield PublisherSpec(WORKER.pod, endpoint, replay)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def publish_apart(saved: Path) -> None:
    """The child of `buffered_apart`: publish, say where, serve replays until terminated."""
    payloads: list[bytes] = msgspec.msgpack.decode(saved.read_bytes())  # noqa: ASYNC240
    async with buffered_inline(payloads) as spec:
        print("publishing", spec.endpoint, spec.replay_endpoint, flush=True)
        await asyncio.Event().wait()


async def recover(
    store: IndexStore, spec: PublisherSpec, batches: int, deadline: float
) -> tuple[float, float] | str:
    """Seconds from the stream's start to the last buffered batch applied, and this
    process's CPU seconds meanwhile; or, when that takes over `deadline` seconds (a replay
    that failed), what was applied by then."""
    pool = StreamPool([spec], store)
    started, cpu = time.perf_counter(), time.process_time()
    await pool.start()
    try:
        last = batches - 1
        while True:
            fence = await store.fence(WORKER)
            if fence is not None and fence.seq == last:
                return time.perf_counter() - started, time.process_time() - cpu
            if time.perf_counter() - started > deadline:
                at = "nothing" if fence is None else f"seq {fence.seq}"
                return f"incomplete after {deadline:g} s: {at} applied of 0-{last}"
            await asyncio.sleep(0.01)
    finally:
        await pool.stop()


def _server_stats(ports: list[int]) -> tuple[float, float, int]:
    """Over the servers: CPU seconds (user + sys), EVALSHA seconds and calls since reset."""
    cpu = evalsha = 0.0
    calls = 0
    for port in ports:
        client = redis.Redis(port=port)
        info = client.info("cpu")
        cpu += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
        stats = client.info("commandstats").get("cmdstat_evalsha", {})
        evalsha += float(stats.get("usec", 0)) / 1e6
        calls += int(stats.get("calls", 0))
    return cpu, evalsha, calls


def _reset(ports: list[int]) -> None:
    for port in ports:
        client = redis.Redis(port=port)
        client.flushall()
        client.config_resetstat()


async def run_store(
    name: str,
    url: str | None,
    ports: list[int],
    payloads: list[bytes],
    runs: int,
    saved: Path | None,
    deadline: float,
) -> list[float]:
    """The seconds of each complete run (an incomplete one is printed, not counted)."""
    seconds = []
    for _ in range(runs):
        _reset(ports)
        cpu_before = _server_stats(ports)[0] if ports else 0.0
        store: IndexStore = MemoryStore() if url is None else RedisStore.from_url(url)
        try:
            if saved is None:
                async with buffered_inline(payloads) as spec:
                    took = await recover(store, spec, len(payloads), deadline)
            else:
                async with buffered_apart(saved) as spec:
                    took = await recover(store, spec, len(payloads), deadline)
        finally:
            await store.close()
        if isinstance(took, str):
            print(f"{name:<7} {took}", flush=True)
            continue
        seconds.append(took[0])
        line = f"{name:<7} {took[0]:7.2f} s  client cpu {took[1]:5.2f} s"
        if ports:
            cpu, evalsha, calls = _server_stats(ports)
            line += (
                f"  redis cpu {cpu - cpu_before:5.2f} s, apply script {evalsha:5.2f} s"
                f" in {calls:,} calls ({evalsha / max(calls, 1) * 1e3:.2f} ms each)"
            )
        print(line, flush=True)
    return seconds


@contextlib.contextmanager
def redis_of(kind: str) -> Iterator[tuple[str, list[int]]]:
    """The store URL and every server's port of a private standalone server or cluster."""
    if kind == "standalone":
        with redis_server(512) as port:
            yield f"redis://127.0.0.1:{port}/0", [port]
        return
    cluster = RedisClusterServers()
    try:
        cluster.start()
        yield cluster.url, [node.port for node in cluster.nodes]
    finally:
        cluster.remove()


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "publish":
        asyncio.run(publish_apart(Path(sys.argv[2])))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--redis", choices=["standalone", "cluster", "both"], default="both")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory store")
    parser.add_argument(
        "--publisher",
        choices=["apart", "inline"],
        default="apart",
        help="the publisher in a process of its own (as an engine's), or in this one",
    )
    parser.add_argument(
        "--deadline", type=float, default=120.0, help="seconds before a run counts as incomplete"
    )
    args = parser.parse_args()
    payloads = agentic(args.batches, args.seed)
    events = block_events(payloads)
    print(f"{args.batches:,} buffered batches, {events:,} block-events, publisher {args.publisher}")
    saved: Path | None = None
    if args.publisher == "apart":
        saved = Path(tempfile.mkdtemp(prefix="replay-recovery-")) / "payloads.msgpack"
        saved.write_bytes(msgspec.msgpack.encode(payloads))
    results = {}
    if not args.no_memory:
        results["memory"] = asyncio.run(
            run_store("memory", None, [], payloads, args.runs, saved, args.deadline)
        )
    kinds = ["standalone", "cluster"] if args.redis == "both" else [args.redis]
    for kind in kinds:
        name = "redis" if kind == "standalone" else "cluster"
        with redis_of(kind) as (url, ports):
            results[name] = asyncio.run(
                run_store(name, url, ports, payloads, args.runs, saved, args.deadline)
            )
    for name, seconds in results.items():
        if not seconds:
            print(f"median {name:<7} no complete run")
            continue
        median = statistics.median(seconds)
        print(f"median {name:<7} {median:7.2f} s  {events / median:12,.0f} block-events/s")


if __name__ == "__main__":
    main()
