"""How fast, how small and how quick is the Redis store? Ingest, memory per entry, query latency.

Run: `.venv/bin/python bench/ingest_redis.py` (see bench/README.md). Starts its own
redis-server on a free loopback port (no persistence), prints every figure, stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import random
import re
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import redis
from ingest_memory import agentic, block_events, small_events

from kvsi.api.app import create_app
from kvsi.logs import configure_logging
from kvsi.loops import loop_factory, loop_name
from kvsi.store.model import Batch, EntriesStored, WorkerKey
from kvsi.store.redis import RedisStore
from kvsi.store.redis.layout import decode_residency
from kvsi.subscriber.applier import RUN_MAX
from kvsi.subscriber.decode import ingest_decoder

INTSET_ENTRIES = 512
"""The server's `set-max-intset-entries`: Redis' default, which the small workload's session
sets (about 25 blocks each) stay well under."""


@contextmanager
def redis_server(intset_entries: int) -> Iterator[int]:
    """A throwaway redis-server on a free loopback port; yields the port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    workdir = Path(tempfile.mkdtemp(prefix="kvsi-bench-"))
    proc = subprocess.Popen(
        [
            "redis-server", "--bind", "127.0.0.1", "--port", str(port), "--dir", str(workdir),
            "--save", "", "--appendonly", "no",
            "--set-max-intset-entries", str(intset_entries),
        ],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(port=port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


def store_at(port: int) -> RedisStore:
    return RedisStore.from_url(f"redis://127.0.0.1:{port}?prefix=bench")


async def ingest_streams(
    port: int, payloads: list[bytes], workers: range, group: int, start_at: float = 0.0
) -> tuple[float, float, float]:
    """Decode + apply every payload as one concurrent stream per worker index in `workers`,
    starting at wall time `start_at` (0: now). Returns wall times at the start and the end,
    and CPU seconds."""
    store = store_at(port)

    async def stream(i: int) -> None:
        decoder = ingest_decoder()
        worker = WorkerKey(f"pod-{i}", 0)
        run: list[Batch] = []
        for seq, payload in enumerate(payloads):
            decoded = decoder.decode(payload)
            run.append(Batch(seq, decoded.ts, decoded.events))
            if len(run) == group:
                await store.apply_many(worker, run)
                run = []
        if run:
            await store.apply_many(worker, run)

    await store.fence(WorkerKey("warm-up", 0))  # connected before the clock starts
    if start_at:
        await asyncio.sleep(max(0.0, start_at - time.time()))
    started, cpu = time.time(), time.process_time()
    await asyncio.gather(*(stream(i) for i in workers))
    cpu = time.process_time() - cpu
    ended = time.time()
    await store.close()
    return started, ended, cpu


def _sidecar(
    port: int,
    payloads: list[bytes],
    workers: range,
    group: int,
    start_at: float,
    event_loop: str,
    out: Any,
) -> None:
    """One ingest process of a fleet of sidecars (multiprocessing target)."""
    with asyncio.Runner(loop_factory=loop_factory(event_loop)) as runner:
        out.put(runner.run(ingest_streams(port, payloads, workers, group, start_at)))


async def ingest(
    port: int, payloads: list[bytes], workers: int, processes: int, group: int, event_loop: str
) -> tuple[float, float, float]:
    """Decode + apply every payload as `workers` concurrent streams into an empty server,
    spread over `processes` processes (1: this one; more: one sidecar process each, as a
    fleet of per-pod sidecars shares one Redis), `group` batches per store call (1: one
    `apply` each, a stream keeping up; RUN_MAX: the runs a stream behind its publisher
    stores with `apply_many`).

    Returns (seconds, client CPU seconds of all processes, server CPU seconds).
    """
    raw = redis.Redis(port=port)
    raw.flushall()
    raw.config_resetstat()  # INFO commandstats from here on: this run's (`--commandstats`)
    server_before = _server_cpu(raw)
    if processes == 1:
        started, ended, cpu = await ingest_streams(port, payloads, range(workers), group)
        elapsed = ended - started
    else:
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        start_at = time.time() + 3.0  # every process started and connected by then
        shares = [range(p, workers, processes) for p in range(processes)]
        procs = [
            ctx.Process(
                target=_sidecar,
                args=(port, payloads, share, group, start_at, event_loop, results),
            )
            for share in shares
        ]
        for proc in procs:
            proc.start()
        done = [results.get(timeout=600) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
        elapsed = max(ended for _, ended, _ in done) - min(started for started, _, _ in done)
        cpu = sum(c for _, _, c in done)
    server = _server_cpu(raw) - server_before
    return elapsed, cpu, server


def print_commandstats(raw: redis.Redis, batches: int) -> None:
    """The last run's commands as Redis counts them (a script's own calls included, and in
    its EVALSHA's time too), per batch: where the server's time goes."""
    stats = raw.info("commandstats")
    rows = sorted(
        (
            (float(v["usec"]), name.removeprefix("cmdstat_"), int(v["calls"]))
            for name, v in stats.items()
        ),
        reverse=True,
    )
    for usec, name, calls in rows:
        if calls and name not in ("flushall", "config|resetstat", "info"):
            print(
                f"    {name:<14} calls/batch {calls / batches:7.2f}  us/batch {usec / batches:7.1f}"
                f"  us/call {usec / calls:7.2f}"
            )


def _server_cpu(raw: redis.Redis) -> float:
    info = raw.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def sadd_baseline(port: int) -> float:
    """`redis-benchmark -P 64 -t sadd` on the same server: requests/s."""
    out = subprocess.run(
        ["redis-benchmark", "-p", str(port), "-P", "64", "-t", "sadd", "-n", "2000000", "-q"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    rates = re.findall(r"SADD: ([\d.]+) requests per second", out)
    return float(rates[-1])


async def memory_per_entry(port: int, entries: int, seed: int) -> tuple[int, int, float]:
    """Bytes of used_memory per resident (session, block) entry, everything included.

    Workers of DESIGN.md's shape (50,000 resident blocks, 2,000 sessions each) until
    `entries` resident (session, block) entries; returns (entries, bytes, bytes/entry).
    """
    raw = redis.Redis(port=port)
    raw.flushall()
    before = int(raw.info("memory")["used_memory"])
    payloads = small_events(800, seed)  # 51,200 stored, 50,000 resident
    store = store_at(port)
    decoder = ingest_decoder()
    decoded = [decoder.decode(p) for p in payloads]
    resident = 0
    worker_count = 0
    while resident < entries:
        worker = WorkerKey(f"pod-{worker_count}", 0)
        for seq, d in enumerate(decoded):
            await store.apply(worker, Batch(seq, d.ts, d.events))
        res = raw.hgetall(store.worker_keys(worker).res)
        resident += sum(sum(decode_residency(v)[1].values()) for v in res.values())
        worker_count += 1
    await store.close()
    used = int(raw.info("memory")["used_memory"]) - before
    return resident, used, used / resident


async def query_latency(
    port: int, sessions: int, queries: int, seed: int
) -> tuple[list[float], list[float]]:
    """p50/p99 inputs: seconds per get_session, and per GET /v1/sessions/{id} over ASGI.

    `sessions` sessions on 8 workers: each holds 8 blocks on one worker and 2 on the next.
    """
    raw = redis.Redis(port=port)
    raw.flushall()
    store = store_at(port)
    rng = random.Random(seed)
    workers = [WorkerKey(f"pod-{i}", 0) for i in range(8)]
    seqs = dict.fromkeys(workers, 0)
    for first in range(0, sessions, 64):
        per_worker: dict[WorkerKey, list[EntriesStored]] = {w: [] for w in workers}
        for k in range(first, min(first + 64, sessions)):
            home = k % len(workers)
            per_worker[workers[home]].append(
                EntriesStored([rng.getrandbits(64) for _ in range(8)], "GPU", 0, f"sess-{k}")
            )
            per_worker[workers[(home + 1) % len(workers)]].append(
                EntriesStored([rng.getrandbits(64) for _ in range(2)], "CPU", 0, f"sess-{k}")
            )
        for worker, events in per_worker.items():
            await store.apply(worker, Batch(seqs[worker], 1000.0 + first, list(events)))
            seqs[worker] += 1
    picks = [f"sess-{rng.randrange(sessions)}" for _ in range(queries)]
    store_times = []
    for sid in picks:
        started = time.perf_counter()
        view = await store.get_session(sid)
        store_times.append(time.perf_counter() - started)
        assert view is not None and view.total_blocks == 10
    api_times = []
    transport = httpx.ASGITransport(app=create_app(store))
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        for sid in picks:
            started = time.perf_counter()
            response = await client.get(f"/v1/sessions/{sid}")
            api_times.append(time.perf_counter() - started)
            assert response.status_code == 200
    await store.close()
    return store_times, api_times


async def feed_latency(port: int, batches: int, seed: int) -> list[float]:
    """Seconds from a writer's `apply` returning to the first change of its batch in another
    store's hub (an API replica's `change_feed()`), batches applied one at a time."""
    raw = redis.Redis(port=port)
    raw.flushall()
    writer, reader = store_at(port), store_at(port)
    sub = (await reader.change_feed()).subscribe(after=None)
    decoder = ingest_decoder()
    worker = WorkerKey("pod-0", 0)
    times = []
    for seq, payload in enumerate(small_events(batches, seed)):
        decoded = decoder.decode(payload)
        await writer.apply(worker, Batch(seq, decoded.ts, decoded.events))
        started = time.perf_counter()
        try:
            await asyncio.wait_for(sub.next(), 5.0)
        except TimeoutError:
            continue  # a batch that changed no residency has no record
        times.append(time.perf_counter() - started)
        while not sub.queue.empty():
            sub.queue.get_nowait()
    await writer.close()
    await reader.close()
    return times


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=2000, help="batches per worker")
    parser.add_argument("--workers", type=int, default=4, help="concurrent streams")
    parser.add_argument(
        "--processes", type=int, default=2, help="also run the streams over this many processes"
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--feed-batches", type=int, default=500)
    parser.add_argument(
        "--commandstats",
        action="store_true",
        help="after each ingest row, its last run's INFO commandstats per batch",
    )
    parser.add_argument(
        "--event-loop",
        choices=["auto", "uvloop", "asyncio"],
        default="auto",
        help="the clients' loop, as the service's `event_loop` setting (default: its default)",
    )
    args = parser.parse_args()
    configure_logging("warning", "console")  # (3)'s requests would log a line each
    with asyncio.Runner(loop_factory=loop_factory(args.event_loop)) as runner:
        runner.run(run(args))


async def run(args: argparse.Namespace) -> None:
    with redis_server(INTSET_ENTRIES) as port:
        version = redis.Redis(port=port).info("server")["redis_version"]
        print(f"redis-server {version}, set-max-intset-entries {INTSET_ENTRIES}, port {port}")
        print(f"event loop: {loop_name()}")
        print(f"\n(1) ingest: {args.workers} concurrent worker streams, decode + apply")
        print(
            f"{'workload':<16} {'block-events':>12} {'ingest/s':>10}"
            f" {'client us/batch':>15} {'redis us/batch':>14} {'sadd/s':>10} {'ratio':>6}"
        )
        for name, make in (("small", small_events), ("agentic", agentic)):
            payloads = make(args.batches, args.seed)
            n = block_events(payloads) * args.workers
            batches = len(payloads) * args.workers
            for procs, group in itertools.product(sorted({1, args.processes}), (1, RUN_MAX)):
                runs, sadds = [], []
                for _ in range(args.runs):
                    sadds.append(sadd_baseline(port))
                    runs.append(
                        await ingest(port, payloads, args.workers, procs, group, args.event_loop)
                    )
                label = f"{name} x{procs} g{group}"
                rate = statistics.median(n / elapsed for elapsed, _, _ in runs)
                ratio = statistics.median(
                    n / elapsed / sadd for (elapsed, _, _), sadd in zip(runs, sadds, strict=True)
                )
                client = statistics.median(cpu for _, cpu, _ in runs) / batches * 1e6
                server = statistics.median(srv for _, _, srv in runs) / batches * 1e6
                print(
                    f"{label:<16} {n:>12,} {rate:>10,.0f} {client:>15.0f} {server:>14.0f}"
                    f" {statistics.median(sadds):>10,.0f} {ratio:>6.3f}"
                )
                if args.commandstats:
                    print_commandstats(redis.Redis(port=port), batches)
        print(
            f"(medians of {args.runs} runs; xN: the streams spread over N processes;"
            f" gK: K batches per store call; sadd/s: `redis-benchmark -P 64 -t sadd` on the"
            f" same server just before each run; ratio: each run's ingest/s over its own"
            f" sadd/s, target >= 0.25)"
        )

        entries, used, per = await memory_per_entry(port, args.entries, args.seed)
        print(f"\n(2) memory: {entries:,} resident (session, block) entries")
        print(f"used_memory delta {used:,} bytes = {per:.1f} bytes/entry  (target <= 80)")

        store_times, api_times = await query_latency(port, args.sessions, args.queries, args.seed)
        print(
            f"\n(3) query latency, {args.sessions:,} sessions on 8 workers, {args.queries} queries"
        )
        for name, times in (
            ("store.get_session", store_times),
            ("GET /v1/sessions/{id}", api_times),
        ):
            p50, p99 = pct(times, 0.5) * 1e3, pct(times, 0.99) * 1e3
            print(f"{name:<22} p50 {p50:.3f} ms  p99 {p99:.3f} ms")

        times = await feed_latency(port, args.feed_batches, args.seed)
        print(f"\n(4) change feed: apply returned -> change in another store's hub, {len(times)}")
        print(f"p50 {pct(times, 0.5) * 1e3:.3f} ms  p99 {pct(times, 0.99) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
