"""How quickly do `POST /v1/route` and `GET /v1/sessions/{id}` answer while ingest runs?

Run: `.venv/bin/python bench/route_latency.py [--store memory|redis] [--rps 100,300,500]`
(see bench/README.md). Three processes on loopback: this one runs 100 simulated vLLM
publishers (ZMQ PUB + replay ROUTER) and, for `redis`, its own redis-server; `kvsi serve`
subscribes to them, builds the index (100,000 sessions, 1,000,000 entries) by replay, applies
a steady 50,000 block-events/s and serves the real app; bench/loadgen.py sends the open-loop
load. Prints p50/p99/max per request kind, achieved rps, errors, the ingest rate the service
kept and each process's CPU, for every rps point and run, then the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
from ingest_redis import redis_server
from processes import REPO, background

from kvsi.logs import configure_logging
from kvsi.simulator.fleet import FILES_PER_WORKER, SOCKETS_PER_WORKER
from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.subscriber.sockets import FILES_KEPT, sized_context
from kvsi.subscriber.wire import BlockRemoved, BlockStored, KVCacheEvent

BLOCKS_PER_SESSION = 10
"""1,000,000 entries over 100,000 sessions; a session's blocks are a chain on one worker."""
PREFILL_SESSIONS_PER_BATCH = 64
STORES_PER_BATCH = 8
BLOCKS_PER_STORE = 4
LOAD_SESSIONS = 1_000
"""Steady-ingest sessions (at least one per worker): session `load-<n>` stores on worker
n % workers only, each store continuing the session's chain there."""
LOAD_BLOCKS_PER_WORKER = 1_000
"""Steady-ingest blocks kept per worker before each store evicts as many (100,000 in all)."""
TOKENS = list(range(BLOCKS_PER_STORE * 16))
"""Token ids of a steady store (block size 16): on the wire as vLLM sends them, skipped by
the ingest decoder."""
PACE_SECONDS = 0.005
"""The publishers send what is due every this often: 4 batches a time at 50,000/s."""
LATE_SECONDS = 0.02
"""Publishers behind their pace by more than this are reported (a burst of the fleet)."""
MAX_LATE = 5
"""Most publisher delays reported per point, the longest first."""
QUOTA_PERIOD_US = 2_000
"""The CFS period of `--cpu-quota`: the service runs at most its share of each 2 ms, so a
throttle adds at most ~1 ms to a request's wait at half a core (below half, the period
grows: Linux's least quota is 1 ms)."""
BUILD_SECONDS = 600
"""Longest wait for the service to build the index by replay (or to settle after a point)
before the run is abandoned."""
SETTLED_SECONDS = 0.02
METRICS_SECONDS = 120
"""Longest wait for a process's /metrics: after an overloaded point it answers behind the
backlog of requests the loadgen gave up on."""


def session_hashes(session: int) -> list[int]:
    """The chain of block hashes of a session's prompt (deterministic, u64)."""
    rng = random.Random(session)
    return [rng.getrandbits(64) for _ in range(BLOCKS_PER_SESSION)]


def worker_of(session: int, workers: int) -> int:
    return session % workers


def stored(
    hashes: list[int], session: str, tokens: list[int], parent: int | None = None
) -> BlockStored:
    """A store of `hashes`; `parent` None starts a prompt (vLLM's position 0)."""
    return BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=parent,
        token_ids=tokens,
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        session_id=session,
    )


class Fleet:
    """The simulated publishers: the prefill in their replay buffers, then a steady rate."""

    def __init__(self, workers: int) -> None:
        self._ctx, _ = sized_context(
            workers * SOCKETS_PER_WORKER, workers * FILES_PER_WORKER + FILES_KEPT
        )
        self.pubs = [
            SimulatedPublisher(
                "tcp://127.0.0.1:*",
                replay_endpoint="tcp://127.0.0.1:*",
                pod=f"vllm-{w}",
                context=self._ctx,
            )
            for w in range(workers)
        ]
        self._rng = random.Random(1)
        self._live: list[list[int]] = [[] for _ in range(workers)]
        self._tails: dict[str, int] = {}
        """The last block each steady session stored: the parent of its next store."""
        self._next = 0
        self.block_events = 0
        self.late: list[tuple[float, float]] = []
        """When (time.monotonic()) and how far (s) the publishers ran behind their pace by
        more than LATE_SECONDS: what they then sent at once, a burst of the fleet."""

    async def start(self) -> None:
        for pub in self.pubs:
            await pub.start()

    async def close(self) -> None:
        for pub in self.pubs:
            await pub.close()
        self._ctx.destroy(linger=0)

    def publishers(self) -> list[dict[str, Any]]:
        """The `publishers` setting of the service that subscribes to this fleet."""
        return [
            {"pod": f"vllm-{w}", "endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint}
            for w, p in enumerate(self.pubs)
        ]

    def prefill_batches(self, w: int, sessions: int) -> Iterator[list[KVCacheEvent]]:
        """Worker `w`'s share of the prefill: its sessions' chains, 64 sessions a batch."""
        mine = range(w, sessions, len(self.pubs))
        for start in range(0, len(mine), PREFILL_SESSIONS_PER_BATCH):
            chunk = mine[start : start + PREFILL_SESSIONS_PER_BATCH]
            yield [stored(session_hashes(s), f"sess-{s}", []) for s in chunk]

    async def prefill(self, sessions: int) -> None:
        """Every session's chain on its worker, published before anyone subscribes: the
        service gets it by replay, as a late-joining subscriber does."""
        for w, pub in enumerate(self.pubs):
            for events in self.prefill_batches(w, sessions):
                await pub.publish(events)

    async def steady(self, rate: float) -> None:
        """Publish `rate` block-events/s until cancelled, round robin over the workers."""
        started = time.monotonic()
        sent = 0
        while True:
            due = rate * (time.monotonic() - started)
            if due - sent > LATE_SECONDS * rate:
                self.late.append((time.monotonic(), (due - sent) / rate))
            while sent < due:
                sent += await self._publish_next()
            await asyncio.sleep(PACE_SECONDS)

    async def _publish_next(self) -> int:
        """One batch: 8 stores of 4 fresh blocks, and once a worker holds its share of
        steady blocks, the evictions of as many old ones. Returns its block-events.

        Each store continues its session's chain on the worker (its parent is the session's
        last block), as vLLM names the parent of every store but a prompt's first: only a
        session's first store asserts a first block in the Redis block directory."""
        workers = len(self.pubs)
        per_worker = max(1, LOAD_SESSIONS // workers)
        w = self._next
        self._next = (w + 1) % workers
        live = self._live[w]
        events: list[KVCacheEvent] = []
        n = STORES_PER_BATCH * BLOCKS_PER_STORE
        for _ in range(STORES_PER_BATCH):
            fresh = [self._rng.getrandbits(64) for _ in range(BLOCKS_PER_STORE)]
            live.extend(fresh)
            session = f"load-{w + workers * self._rng.randrange(per_worker)}"
            events.append(stored(fresh, session, TOKENS, self._tails.get(session)))
            self._tails[session] = fresh[-1]
        while len(live) > LOAD_BLOCKS_PER_WORKER:
            old, live[:] = live[:BLOCKS_PER_STORE], live[BLOCKS_PER_STORE:]
            events.append(BlockRemoved(block_hashes=list(old), medium="GPU"))
            n += BLOCKS_PER_STORE
        await self.pubs[w].publish(events)
        self.block_events += n
        return n


def load_requests(port: int, sessions: int, workers: int, count: int) -> str:
    """Loadgen's input: alternating route and session requests for random sessions, with the
    start of each right answer (the session's worker ranked first; its 10 blocks)."""
    rng = random.Random(2)
    host = f"Host: 127.0.0.1:{port}\r\n"
    lines = []
    for i in range(count):
        s = rng.randrange(sessions)
        pod = f"vllm-{worker_of(s, workers)}"
        if i % 2:
            prompt = [str(h) for h in session_hashes(s)] + ["1", "2"]
            body = json.dumps({"session_id": f"sess-{s}", "block_hashes": prompt})
            request = (
                f"POST /v1/route HTTP/1.1\r\n{host}Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}"
            )
            item = {"kind": "route", "expect": f'{{"ranking":[{{"pod":"{pod}","dp_rank":0,'}
        else:
            request = f"GET /v1/sessions/sess-{s} HTTP/1.1\r\n{host}\r\n"
            expect = f'{{"session_id":"sess-{s}","total_blocks":{BLOCKS_PER_SESSION},'
            item = {"kind": "session", "expect": expect}
        lines.append(json.dumps(item | {"request": request}))
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Sample:
    """What the service's /metrics and, for Redis, the server's INFO say at one moment."""

    at: float
    block_events: float
    cpu: float
    ingest_cpu: float
    """CPU seconds of the ingest process, with --split (else 0: `cpu` has it all)."""
    full_gcs: float
    lost: float
    redis_cpu: float
    machine_cpu: float


def metric(text: str, name: str) -> float:
    """The sum of a metric's samples in Prometheus text (0 if absent)."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", re.M)
    return sum(float(v) for v in pattern.findall(text))


def machine_cpu() -> float:
    """CPU seconds every process of the machine has used (all cores), from /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split()[1:9]
    )
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def sample(bases: list[str], redis_port: int | None) -> Sample:
    """Metrics summed over the service's processes (`bases`: each one's /metrics root)."""
    texts = [httpx.get(f"{base}/metrics", timeout=METRICS_SECONDS).text for base in bases]
    text = "".join(texts)
    redis_cpu = 0.0
    if redis_port is not None:
        info = redis.Redis(port=redis_port).info("cpu")
        redis_cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return Sample(
        at=time.monotonic(),
        block_events=metric(text, "kvsi_fleet_block_events_total"),
        cpu=metric(texts[0], "process_cpu_seconds_total"),
        ingest_cpu=sum(metric(t, "process_cpu_seconds_total") for t in texts[1:]),
        full_gcs=sum(
            float(v)
            for v in re.findall(
                r'^python_gc_collections_total{generation="2"} ([0-9.e+]+)$', text, re.M
            )
        ),
        lost=metric(text, "kvsi_fleet_batches_lost_total"),
        redis_cpu=redis_cpu,
        machine_cpu=machine_cpu(),
    )


async def measure(
    args: argparse.Namespace,
    fleet: Fleet,
    bases: list[str],
    port: int,
    rps: float,
    redis_port: int | None,
) -> dict[str, Any]:
    """One point: loadgen at `rps` for `--duration` s, with the service's figures around it."""
    total = int(rps * args.duration)
    requests = load_requests(port, args.sessions, len(fleet.pubs), min(total, 20_000))
    published = fleet.block_events
    fleet.late.clear()
    started = time.monotonic()
    cpu = time.process_time()
    children = _children_cpu()
    before = await asyncio.to_thread(sample, bases, redis_port)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).with_name("loadgen.py")),
        "--port", str(port), "--rps", str(rps), "--duration", str(args.duration),
        "--connections", str(args.connections),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    out, _ = await proc.communicate(requests.encode())
    after = await asyncio.to_thread(sample, bases, redis_port)
    if proc.returncode != 0:
        raise RuntimeError(f"loadgen exited with {proc.returncode}")
    report: dict[str, Any] = json.loads(out)
    wall = after.at - before.at
    report["ingest_applied"] = (after.block_events - before.block_events) / wall
    report["ingest_published"] = (fleet.block_events - published) / wall
    report["publishers_late"] = [
        {"at_s": at - started, "ms": late * 1000}
        for at, late in sorted(fleet.late, key=lambda e: -e[1])[:MAX_LATE]
    ]
    report["batches_lost"] = after.lost - before.lost
    report["full_gcs"] = after.full_gcs - before.full_gcs
    report["cpu"] = {
        "service": (after.cpu - before.cpu) / wall,
        "ingest": (after.ingest_cpu - before.ingest_cpu) / wall,
        "redis": (after.redis_cpu - before.redis_cpu) / wall,
        "publishers": (time.process_time() - cpu) / wall,
        "loadgen": (_children_cpu() - children) / wall,
    }
    ours = sum(report["cpu"].values())
    report["cpu"]["others"] = (after.machine_cpu - before.machine_cpu) / wall - ours
    return report


def _children_cpu() -> float:
    """CPU seconds of this process's exited children: the loadgen runs, start-up included."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def settled(base: str) -> None:
    """Wait until the service answers a probe within SETTLED_SECONDS twice in a row: the
    backlog of an overloaded point (answers the loadgen no longer waits for) must not
    slow the next one."""
    quick = 0
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        while quick < 2:
            started = time.monotonic()
            await client.get("/healthz")
            quick = quick + 1 if time.monotonic() - started < SETTLED_SECONDS else 0
            await asyncio.sleep(0.2)


async def until_built(base: str, expected: int, workers: int) -> None:
    """Wait until every worker is live and the prefill is in the index (by replay)."""
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                pods = (await client.get("/v1/pods")).json()["pods"]
                live = sum(p["state"] == "live" for p in pods)
                blocks = sum(p["blocks"] for p in pods)
                if live == workers and blocks >= expected:
                    return
            await asyncio.sleep(0.5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def cpu_quota(fraction: float | None) -> Iterator[Path | None]:
    """A CPU cgroup limited to `fraction` of one core in periods of QUOTA_PERIOD_US (cgroup
    v2's `cpu.max`, else v1's `cpu` hierarchy; root only); yields its `cgroup.procs` (None
    without a fraction), removes it after. For a service that computes on one thread, a
    core at that fraction of its speed."""
    if fraction is None:
        yield None
        return
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    unified = v2.exists() and "cpu" in v2.read_text().split()
    root = Path("/sys/fs/cgroup" if unified else "/sys/fs/cgroup/cpu")
    group = root / f"kvsi-bench-{os.getpid()}-{time.monotonic_ns()}"
    group.mkdir()
    try:
        period = max(QUOTA_PERIOD_US, math.ceil(1_000 / fraction))
        quota = round(period * fraction)
        if unified:
            (group / "cpu.max").write_text(f"{quota} {period}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        yield group / "cgroup.procs"
    finally:
        group.rmdir()


@contextlib.contextmanager
def service(
    store: str, publishers: list[dict[str, Any]], port: int, *options: str, quota: float | None
) -> Iterator[Path]:
    """`kvsi serve` on `port` (with `options`), its log in a file; yields the log's path,
    stops it after. With `quota`, in a `cpu_quota` group of its own from its first
    instruction on.

    In a session of its own, as the loadgen (see `processes.background`).
    """
    env = {"KVSI_PUBLISHERS": json.dumps(publishers), "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "kvsi", "serve", "--port", str(port), "--store", store]
    with cpu_quota(quota) as procs:
        if procs is not None:
            argv = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *argv]
        with background([*argv, *options], env, "kvsi-bench-") as (_, log):
            yield log  # stopped when this ends, before its group is removed


async def run(args: argparse.Namespace, store: str, redis_port: int | None) -> list[dict[str, Any]]:
    fleet = Fleet(args.workers)
    await fleet.start()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    points = [float(r) for r in args.rps.split(",")]
    results = []
    try:
        await fleet.prefill(args.sessions)
        with contextlib.ExitStack() as stack:
            bases = [base]
            if args.split:
                # The sidecar shape: ingest in a process of its own, the API reading Redis.
                ingest_port = free_port()
                stack.enter_context(
                    service(store, fleet.publishers(), free_port(), "--no-api",
                            "--metrics-port", str(ingest_port), quota=args.cpu_quota)
                )  # fmt: skip
                bases.append(f"http://127.0.0.1:{ingest_port}")
                log = stack.enter_context(
                    service(store, [], port, "--no-ingest", quota=args.cpu_quota)
                )
            else:
                log = stack.enter_context(
                    service(store, fleet.publishers(), port, quota=args.cpu_quota)
                )
            try:
                built = time.monotonic()
                async with asyncio.timeout(BUILD_SECONDS):
                    entries = args.sessions * BLOCKS_PER_SESSION
                    await until_built(base, entries, args.workers)
                print(f"index built by replay in {time.monotonic() - built:.1f} s", flush=True)
            except TimeoutError:
                print(log.read_text()[-4000:], file=sys.stderr)
                raise
            ingest = asyncio.create_task(fleet.steady(args.ingest_rate))
            try:
                await asyncio.sleep(args.warmup)
                for n in range(args.runs):
                    # Alternate the order: drift of a shared machine spreads over every point.
                    for rps in points if n % 2 == 0 else points[::-1]:
                        async with asyncio.timeout(BUILD_SECONDS):
                            await settled(base)
                        report = await measure(args, fleet, bases, port, rps, redis_port)
                        report |= {"rps": rps, "run": n + 1}
                        print(line(report), flush=True)
                        print(stalls_line(report), flush=True)
                        for kind in report["kinds"].values():
                            for why, body in kind["error_examples"].items():
                                print(f"    {why}: {body}", flush=True)
                        results.append(report)
            finally:
                ingest.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ingest
    finally:
        await fleet.close()
    return results


def line(r: dict[str, Any]) -> str:
    kinds = "  ".join(
        f"{kind} p50={k['p50_ms']:.2f} p99={k['p99_ms']:.2f} max={k['max_ms']:.1f} ms"
        f" errors={_errors(k['errors'])}"
        for kind, k in r["kinds"].items()
    )
    cpu = " ".join(f"{name}={share:.0%}" for name, share in r["cpu"].items())
    return (
        f"run {r['run']} rps={r['rps']:g} achieved={r['achieved_rps']:.0f}  {kinds}  "
        f"ingest={r['ingest_applied']:,.0f}/s (published {r['ingest_published']:,.0f}/s, "
        f"lost {r['batches_lost']:g})  full-gc={r['full_gcs']:g}  "
        f"send-lag-p99={r['send_lag_p99_ms']:.2f} ms queued<={r['max_queued']}  cpu {cpu}"
    )


def stalls_line(r: dict[str, Any]) -> str:
    """The longest bursts of answers over the p99 target: when, how many, how long; and
    when the publishers ran late (a burst of the fleet followed)."""
    bursts = ", ".join(
        f"{b['at_s']:.1f} s ({b['answers']:g}, {b['max_ms']:.0f} ms)" for b in r["stalls"]
    )
    late = ", ".join(f"{e['at_s']:.1f} s ({e['ms']:.0f} ms)" for e in r["publishers_late"])
    return (
        f"    stalls (at, answers over 15 ms, longest): {bursts or 'none'}; "
        f"publishers late (at, by): {late or 'never'}"
    )


def _errors(errors: dict[str, int]) -> str:
    """`0`, or the count by reason: `12 (timeout 10, status 503 2)`."""
    total = sum(errors.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{why} {n}" for why, n in sorted(errors.items())) + ")"


def median_of(runs: list[dict[str, Any]], *path: str) -> float:
    """The median over runs of the figure at `path` in each run's report."""
    values = []
    for r in runs:
        value: Any = r
        for key in path:
            value = value[key]
        values.append(float(value))
    return statistics.median(values)


def point_cells(runs: list[dict[str, Any]]) -> list[str]:
    """A point's achieved rps, p50/p99/max per kind, errors and ingest/s: the medians over
    its runs (errors: the sum)."""
    cells = [f"{median_of(runs, 'achieved_rps'):.0f}"]
    for kind in ("route", "session"):
        quantiles = ("p50_ms", "p99_ms", "max_ms")
        cells += [f"{median_of(runs, 'kinds', kind, q):.2f}" for q in quantiles]
    errors = sum(sum(k["errors"].values()) for r in runs for k in r["kinds"].values())
    return [*cells, str(errors), f"{median_of(runs, 'ingest_applied'):,.0f}"]


def cpu_cells(runs: list[dict[str, Any]]) -> list[str]:
    """A point's CPU shares (service, ingest, Redis, others): the medians over its runs."""
    processes = ("service", "ingest", "redis", "others")
    return [f"{median_of(runs, 'cpu', who):.0%}" for who in processes]


def medians(results: list[dict[str, Any]]) -> None:
    """The table of bench/README.md: medians over runs of each point (errors: the sum)."""
    print("\nmedians over runs:")
    print("| rps | achieved | route p50 | route p99 | route max | session p50 | session p99 | "
          "session max | errors | ingest/s | service CPU | ingest CPU | redis CPU | "
          "others' CPU |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rps in sorted({r["rps"] for r in results}):
        runs = [r for r in results if r["rps"] == rps]
        cells = [
            f"{rps:g}",
            *point_cells(runs),
            *cpu_cells(runs),
        ]
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", choices=["memory", "redis"], default="memory")
    parser.add_argument("--rps", default="100,300,500", help="comma-separated request rates")
    parser.add_argument("--duration", type=float, default=20, help="seconds per point")
    parser.add_argument("--runs", type=int, default=3, help="runs of every point")
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--ingest-rate", type=float, default=50_000, help="block-events/s")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--warmup", type=float, default=5, help="seconds of ingest before")
    parser.add_argument(
        "--split",
        action="store_true",
        help="redis: ingest (--no-api) and API (--no-ingest) in two processes",
    )
    parser.add_argument(
        "--cpu-quota",
        type=float,
        default=None,
        help="each service at most this fraction of one core, in 2 ms periods (root)",
    )
    args = parser.parse_args()
    if args.cpu_quota is not None and not 0 < args.cpu_quota <= 1:
        parser.error(f"--cpu-quota must be in (0, 1], got {args.cpu_quota}")
    if args.split and args.store != "redis":
        parser.error("--split needs --store redis: the memory store lives in one process")
    configure_logging("warning", "console")
    if args.store == "memory":
        results = asyncio.run(run(args, "memory", None))
    else:
        with redis_server(512) as redis_port:
            url = f"redis://127.0.0.1:{redis_port}/0?prefix=bench"
            results = asyncio.run(run(args, url, redis_port))
    medians(results)


if __name__ == "__main__":
    main()
