"""How quickly do `POST /v1/route` and `GET /v1/sessions/{id}` answer under ingest load?

Run: `.venv/bin/python bench/route_latency.py [--store memory|redis]` (see bench/README.md).
A server process holds the index (100 workers, 100,000 sessions, 1,000,000 entries), applies
a steady ingest of 50,000 block-events/s and serves the real API over uvicorn on loopback;
this process sends an open-loop 500 requests/s (half of each kind) and prints p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import uvicorn

from api.app import create_app
from kvsi.janitor import freeze_long_lived, run_gc_freezer
from store.base import IndexStore
from store.model import Batch, BlocksRemoved, BlocksStored, WorkerKey
from store.select import open_store

BLOCKS_PER_SESSION = 10
"""1,000,000 entries over 100,000 sessions; a session's blocks are a chain on one worker."""


def session_hashes(session: int) -> list[int]:
    """The chain of block hashes of a session's prompt (deterministic, u64)."""
    rng = random.Random(session)
    return [rng.getrandbits(64) for _ in range(BLOCKS_PER_SESSION)]


def worker_of(session: int, workers: int) -> WorkerKey:
    return WorkerKey(f"vllm-{session % workers}", 0)


async def prefill(store: IndexStore, workers: int, sessions: int) -> dict[WorkerKey, int]:
    """Every session's chain on its worker, applied in batches; returns the next seq."""
    seqs: dict[WorkerKey, int] = {}
    pending: dict[WorkerKey, list[BlocksStored]] = {}
    for s in range(sessions):
        key = worker_of(s, workers)
        pending.setdefault(key, []).append(BlocksStored(session_hashes(s), "GPU", 0, f"sess-{s}"))
        if len(pending[key]) == 64:
            seq = seqs.get(key, 0)
            await store.apply(key, Batch(seq, 1.0 + seq, list(pending.pop(key))))
            seqs[key] = seq + 1
    for key, events in pending.items():
        seq = seqs.get(key, 0)
        await store.apply(key, Batch(seq, 1.0 + seq, events))
        seqs[key] = seq + 1
    return seqs


async def steady_ingest(
    store: IndexStore, seqs: dict[WorkerKey, int], rate: float, stats: dict[str, float]
) -> None:
    """Store 4 fresh blocks and evict 4 old ones per event pair, at `rate` block-events/s."""
    rng = random.Random(1)
    keys = sorted(seqs)
    live: dict[WorkerKey, list[int]] = {k: [] for k in keys}
    started = time.monotonic()
    sent = 0
    while True:
        key = keys[sent % len(keys)]
        events: list[BlocksStored | BlocksRemoved] = []
        for _ in range(8):
            fresh = [rng.getrandbits(64) for _ in range(4)]
            live[key].extend(fresh)
            events.append(BlocksStored(fresh, "GPU", 0, f"load-{rng.randrange(1000)}"))
        while len(live[key]) > 4_000:
            old, live[key][:] = live[key][:4], live[key][4:]
            events.append(BlocksRemoved(old, "GPU", 0))
        seq = seqs[key]
        seqs[key] = seq + 1
        await store.apply(key, Batch(seq, 1e6 + seq, events))
        sent += 1
        stats["block_events"] += sum(len(e.block_hashes) for e in events)
        stats["seconds"] = time.monotonic() - started
        ahead = started + stats["block_events"] / rate - time.monotonic()
        # Yield every batch, as the service's applier does, so HTTP is served in between.
        await asyncio.sleep(max(ahead, 0))


GC_PAUSES: list[tuple[int, float]] = []


_GC_STARTED = [0.0]


def _time_gc(phase: str, info: dict[str, int]) -> None:
    """gc.callbacks hook: how long each collection stalled the server's event loop."""
    if phase == "start":
        _GC_STARTED[0] = time.perf_counter()
    else:
        GC_PAUSES.append((info["generation"], time.perf_counter() - _GC_STARTED[0]))


async def serve(args: argparse.Namespace) -> None:
    gc.callbacks.append(_time_gc)
    store = open_store(args.store)
    seqs = await prefill(store, args.workers, args.sessions)
    freeze_long_lived()
    GC_PAUSES.clear()
    stats = {"block_events": 0.0, "seconds": 0.0}
    ingest = asyncio.create_task(steady_ingest(store, seqs, args.ingest_rate, stats))
    janitor = asyncio.create_task(run_gc_freezer(args.freeze_interval))
    config = uvicorn.Config(
        create_app(store), host="127.0.0.1", port=args.port, log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    try:
        await server.serve()
    finally:
        ingest.cancel()
        janitor.cancel()
        rate = stats["block_events"] / max(stats["seconds"], 1e-9)
        worst = max((p for g, p in GC_PAUSES if g == 2), default=0.0)
        print(
            json.dumps(
                {
                    "ingest_block_events_per_s": rate,
                    "full_gc": sum(g == 2 for g, _ in GC_PAUSES),
                    "full_gc_max_ms": worst * 1000,
                    "gc_total_ms": sum(p for _, p in GC_PAUSES) * 1000,
                }
            ),
            flush=True,
        )
        await store.close()


async def load(base: str, args: argparse.Namespace) -> dict[str, list[float]]:
    """Open loop: a request every 1/rps seconds whatever the answers do."""
    latencies: dict[str, list[float]] = {"route": [], "session": []}
    rng = random.Random(2)
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=10) as client:

        async def one(i: int) -> None:
            s = rng.randrange(args.sessions)
            started = time.perf_counter()
            if i % 2:
                prompt = [str(h) for h in session_hashes(s)] + ["1", "2"]
                r = await client.post(
                    "/v1/route", json={"session_id": f"sess-{s}", "block_hashes": prompt}
                )
                kind = "route"
            else:
                r = await client.get(f"/v1/sessions/sess-{s}")
                kind = "session"
            r.raise_for_status()
            latencies[kind].append((time.perf_counter() - started) * 1000)

        tasks = []
        begin = time.perf_counter()
        total = int(args.rps * args.duration)
        for i in range(total):
            delay = begin + i / args.rps - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
    return latencies


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", default="memory", help="memory, or a Redis URL")
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--ingest-rate", type=float, default=50_000)
    parser.add_argument("--rps", type=float, default=500)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument(
        "--freeze-interval", type=float, default=2, help="the service's gc_freeze_interval_seconds"
    )
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args))
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--port", str(port), "--store", args.store,
         "--workers", str(args.workers), "--sessions", str(args.sessions),
         "--ingest-rate", str(args.ingest_rate),
         "--freeze-interval", str(args.freeze_interval)],
        stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(Path.cwd())},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        latencies = asyncio.run(load(base, args))
    finally:
        server.send_signal(signal.SIGINT)
        out, _ = server.communicate(timeout=60)
    report = json.loads(out.strip().splitlines()[-1])
    ingest = report["ingest_block_events_per_s"]
    print(
        f"store={args.store} workers={args.workers} sessions={args.sessions} "
        f"entries={args.sessions * BLOCKS_PER_SESSION:,} rps={args.rps:g} "
        f"duration={args.duration:g}s ingest={ingest:,.0f} block-events/s "
        f"full-gc={report['full_gc']} (max {report['full_gc_max_ms']:.1f} ms)"
    )
    for kind, values in latencies.items():
        print(
            f"{kind:<8} n={len(values):>6} p50={pct(values, 50):7.2f} ms "
            f"p99={pct(values, 99):7.2f} ms max={max(values):7.2f} ms"
        )


if __name__ == "__main__":
    main()
