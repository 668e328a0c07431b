"""Route and session latency at fleet size on Redis: 1,000 workers, 1,000,000 sessions.

Run: `.venv/bin/python bench/fleet_latency.py [--redis cluster|standalone] [--workers 1000]`
(see bench/README.md "fleet_latency.py"). route_latency.py's three kinds of process in the
split shape, on a 3-master Redis Cluster (or one server) this bench starts: the simulated
vLLM publishers (this process), ingest-only `kvsi serve --no-api` processes each following
a slice of them, one API-only `kvsi serve --no-ingest`, and bench/loadgen.py. The index is
built before the service starts by a bulk loader through the real apply path: each prefill
batch is published (so the publishers' seqs and replay buffers hold it), decoded with the
ingest decoder and written by `RedisStore.apply_many` in runs of 16, as a stream with a
backlog writes it (same Lua, same directories); the service then resumes from the stored
fences. Per point it adds to route_latency.py's figures the Redis side: commands and Redis
CPU per API request (ingest's share taken out, see `api_share`), and per shard ops/s and
used_memory. Needs redis-server and redis-cli.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import os
import re
import statistics
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import redis
from processes import REPO
from route_latency import (
    BLOCKS_PER_SESSION,
    BLOCKS_PER_STORE,
    BUILD_SECONDS,
    METRICS_SECONDS,
    STORES_PER_BATCH,
    Fleet,
    cpu_cells,
    free_port,
    line,
    measure,
    median_of,
    metric,
    point_cells,
    service,
    settled,
    stalls_line,
    until_built,
)

from kvsi.logs import configure_logging
from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.store.model import Batch, StoreEvent, WorkerKey
from kvsi.store.redis import RedisStore
from kvsi.subscriber.decode import BatchDecoder, ingest_decoder
from kvsi.subscriber.wire import KVCacheEvent

sys.path.insert(0, str(REPO))
from tests.redis_servers import RedisClusterServers, RedisServer

RUN = 16
"""Batches per `apply_many` of the loader: subscriber/applier.py's RUN_MAX."""
LOADING = 8
"""Workers the loader writes at once."""
INTSET_ENTRIES = 8192
"""`set-max-intset-entries`: at 10 workers a part holds 1,000,000 entries, ~7,800 per
entry-index bucket; store/README.md says to raise it with the part size."""
INFO_CALLS = 1
"""Commands a shard sample adds between two samples (its INFO)."""
STEADY_EVENTS_PER_BATCH = (STORES_PER_BATCH + STORES_PER_BATCH) * BLOCKS_PER_STORE
"""Block-events of a steady batch once evicting (route_latency.Fleet._publish_next)."""


@dataclass(frozen=True)
class Shard:
    """One Redis node's counters at one moment."""

    calls: int
    """Commands run, scripts' own included (INFO commandstats)."""
    processed: int
    """Commands received (INFO stats total_commands_processed: Redis' ops)."""
    cpu: float
    memory: int


def shards(ports: list[int]) -> list[Shard]:
    """Every node's counters, one INFO each."""
    out = []
    for port in ports:
        with redis.Redis(port=port) as client:
            info = client.info("all")
        calls = sum(int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_"))
        out.append(
            Shard(
                calls=calls,
                processed=int(info["total_commands_processed"]),
                cpu=float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
                memory=int(info["used_memory"]),
            )
        )
    return out


SLOW_MICROSECONDS = 5_000
"""Commands at least this long are kept in each shard's SLOWLOG and named per point."""
SCRIPTS = {
    hashlib.sha1(path.read_bytes()).hexdigest(): path.stem
    for path in (REPO / "store" / "redis" / "lua").glob("*.lua")
}
"""kvsi's scripts by the SHA1 that EVALSHA names them with."""


def slowlog_reset(ports: list[int]) -> None:
    for port in ports:
        with redis.Redis(port=port) as client:
            client.config_set("slowlog-log-slower-than", SLOW_MICROSECONDS)
            client.slowlog_reset()


def slow_commands(ports: list[int]) -> dict[str, list[float]]:
    """The shards' SLOWLOG since the reset: each command's (a script's name) durations, ms."""
    out: dict[str, list[float]] = {}
    for port in ports:
        with redis.Redis(port=port) as client:
            entries = client.slowlog_get(1024)
        for entry in entries:
            args = bytes(entry["command"]).decode(errors="replace").split()[:2]
            name = args[0].upper() if args else "?"
            if name == "EVALSHA" and len(args) > 1:
                name = SCRIPTS.get(args[1], args[1][:8])
            out.setdefault(name, []).append(entry["duration"] / 1000)
    return out


def applied(bases: list[str]) -> float:
    """Block-events the ingest processes applied so far."""
    return ingest_counters(bases).block_events


@dataclass(frozen=True)
class Ingested:
    """The ingest processes' counters at one moment, summed over them."""

    block_events: float
    applies: float
    """Apply calls (`kvsi_apply_seconds`' count: one per call, a run of batches or one)."""
    cpu: float
    """CPU seconds of the ingest processes (`process_cpu_seconds_total`)."""


def ingest_counters(bases: list[str]) -> Ingested:
    texts = [httpx.get(f"{base}/metrics", timeout=METRICS_SECONDS).text for base in bases]
    return Ingested(
        block_events=sum(metric(t, "kvsi_fleet_block_events_total") for t in texts),
        applies=sum(metric(t, "kvsi_apply_seconds_count") for t in texts),
        cpu=sum(metric(t, "process_cpu_seconds_total") for t in texts),
    )


@dataclass(frozen=True)
class Window:
    """What every shard did over a stretch of time, and the block-events ingest applied."""

    seconds: float
    calls: int
    cpu: float
    block_events: float
    ops: list[float]
    """Per shard: commands received per second."""
    memory: list[int]
    """Per shard: used_memory at the end."""
    applies: float = 0.0
    """Apply calls ingest made (the idle window counts them)."""
    ingest_cpu: float = 0.0
    """CPU seconds of the ingest processes (the idle window counts them)."""


def window(before: list[Shard], after: list[Shard], seconds: float, events: float) -> Window:
    return Window(
        seconds=seconds,
        calls=sum(a.calls - b.calls - INFO_CALLS for a, b in zip(after, before, strict=True)),
        cpu=sum(a.cpu - b.cpu for a, b in zip(after, before, strict=True)),
        block_events=events,
        ops=[(a.processed - b.processed) / seconds for a, b in zip(after, before, strict=True)],
        memory=[a.memory for a in after],
    )


async def idle_window(ports: list[int], ingest: list[str], seconds: float) -> Window:
    """`seconds` of ingest (and the API's background work) without requests."""
    ingested = await asyncio.to_thread(ingest_counters, ingest)
    before = await asyncio.to_thread(shards, ports)
    started = time.monotonic()
    await asyncio.sleep(seconds)
    after = await asyncio.to_thread(shards, ports)
    wall = time.monotonic() - started
    now = await asyncio.to_thread(ingest_counters, ingest)
    return dataclasses.replace(
        window(before, after, wall, now.block_events - ingested.block_events),
        applies=now.applies - ingested.applies,
        ingest_cpu=now.cpu - ingested.cpu,
    )


def per_apply(idle: Window) -> dict[str, float]:
    """The idle window's Redis and ingest CPU (cores); with applies, their rate and each
    one's CPU (µs): ingest's whole work at the fleet's pace, for the sizing model's check
    (its figures are per apply, measured back to back and paced by redis_apply_cost.py,
    and per followed worker: the idle window of the no-ingest point)."""
    rest = {"redis_cores": idle.cpu / idle.seconds, "ingest_cores": idle.ingest_cpu / idle.seconds}
    if idle.applies <= 0:
        return rest
    return rest | {
        "applies_per_s": idle.applies / idle.seconds,
        "block_events_per_apply": idle.block_events / idle.applies,
        "redis_us": idle.cpu / idle.applies * 1e6,
        "ingest_us": idle.ingest_cpu / idle.applies * 1e6,
    }


def api_share(point: Window, idle: Window, requests: int) -> tuple[float, float]:
    """(commands, Redis CPU us) per request: the point's, less what ingest and background
    work cost at the idle window's rate per applied block-event (commands and CPU) and per
    second (what is left when nothing was applied)."""
    if idle.block_events > 0:
        calls = point.calls - idle.calls / idle.block_events * point.block_events
        cpu = point.cpu - idle.cpu / idle.block_events * point.block_events
    else:
        calls = point.calls - idle.calls / idle.seconds * point.seconds
        cpu = point.cpu - idle.cpu / idle.seconds * point.seconds
    return calls / requests, cpu / requests * 1e6


async def published(
    pub: SimulatedPublisher, decoder: BatchDecoder[StoreEvent], events: list[KVCacheEvent]
) -> Batch:
    """Publish `events` (nobody subscribes yet: the replay buffer keeps them) and return the
    batch as a stream would decode it."""
    payload = pub.encode(events)
    seq = await pub.publish_payload(payload)
    decoded = decoder.decode(payload)
    return Batch(seq, decoded.ts, decoded.events)


async def bulk_load(fleet: Fleet, url: str, sessions: int) -> None:
    """Every worker's prefill, published then written through `RedisStore.apply_many`."""
    store = RedisStore.from_url(url)
    gate = asyncio.Semaphore(LOADING)

    async def one(w: int) -> None:
        decoder = ingest_decoder()
        pub = fleet.pubs[w]
        key = WorkerKey(f"vllm-{w}", 0)
        async with gate:
            # A run written as soon as it is published: publishing a worker's whole prefill
            # first held the event loop long enough (10 workers of 100,000 sessions each)
            # to time out the cluster client's connections.
            run: list[Batch] = []
            for events in fleet.prefill_batches(w, sessions):
                run.append(await published(pub, decoder, events))
                if len(run) == RUN:
                    await store.apply_many(key, run)
                    run = []
            if run:
                await store.apply_many(key, run)

    try:
        await asyncio.gather(*(one(w) for w in range(len(fleet.pubs))))
    finally:
        await store.close()


async def caught_up(fleet: Fleet, ingest: list[str], rate: float) -> None:
    """Wait until ingest, once every worker had a steady batch, has applied what was
    published but the last second's: a worker's first steady batch makes its writer load
    the worker's mirror from Redis (O(its entries))."""
    started = time.monotonic()
    first_round = len(fleet.pubs) * STEADY_EVENTS_PER_BATCH / rate
    await asyncio.sleep(first_round + 1)
    while True:
        try:
            behind = fleet.block_events - await asyncio.to_thread(applied, ingest)
        except httpx.HTTPError:  # its loop busy loading mirrors: not yet
            behind = rate + 1
        if behind <= rate:
            break
        await asyncio.sleep(1)
    print(f"ingest caught up {time.monotonic() - started:.1f} s after it started", flush=True)


def connection_waits(base: str) -> tuple[float, float]:
    """A process's store calls that waited for a connection so far, and the seconds they
    waited: a scrape reads two numbers the store keeps, no Redis command."""
    return waits_in(httpx.get(f"{base}/metrics", timeout=METRICS_SECONDS).text)


def waits_in(text: str) -> tuple[float, float]:
    """`kvsi_store_connection_waits_total` and `..._wait_seconds_total` in a scrape."""
    return (
        metric(text, "kvsi_store_connection_waits_total"),
        metric(text, "kvsi_store_connection_wait_seconds_total"),
    )


OUTAGE = re.compile(r"outage_seconds\W+([0-9.]+)")
"""A store.available line's outage length, in the console or the JSON log format."""


def warm_up(ingest: list[str], logs: list[Path]) -> str:
    """What the ingest processes' store calls met while they started: their failed calls
    (`kvsi_store_errors_total`), the calls that waited for a connection (a place, on a
    cluster) and their seconds, and the outages their logs recorded."""
    texts = [httpx.get(f"{base}/metrics", timeout=METRICS_SECONDS).text for base in ingest]
    failed = sum(metric(t, "kvsi_store_errors_total") for t in texts)
    each = [waits_in(t) for t in texts]
    waits, waited = sum(w for w, _ in each), sum(s for _, s in each)
    lines = [line for log in logs for line in log.read_text().splitlines()]
    outages = [float(m[1]) for line in lines if (m := OUTAGE.search(line))]
    unavailable = sum("store.unavailable" in line for line in lines)
    return (
        f"ingest warm-up: {failed:.0f} failed store calls, {waits:.0f} waited for a "
        f"connection ({waited:.2f} s in all), {unavailable} outages logged "
        f"({sum(outages):.2f} s in all, longest {max(outages, default=0):.2f} s)"
    )


@contextlib.contextmanager
def servers(kind: str, intset_entries: int = INTSET_ENTRIES) -> Iterator[tuple[str, list[int]]]:
    """A private redis-server ("standalone") or 3-master cluster ("cluster"); yields the store
    URL (prefix `bench`) and every node's port, and removes it after."""
    options = ("--set-max-intset-entries", str(intset_entries))
    if kind == "cluster":
        cluster = RedisClusterServers(*options)
        try:
            cluster.start()
            url = f"{cluster.url}?prefix=bench"
            yield url, [n.port for n in cluster.nodes]
        finally:
            cluster.remove()
    else:
        server = RedisServer(*options)
        try:
            server.start()
            yield f"{server.url}/0?prefix=bench", [server.port]
        finally:
            server.remove()


async def run(args: argparse.Namespace, url: str, ports: list[int]) -> list[dict[str, Any]]:
    fleet = Fleet(args.workers)
    await fleet.start()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    try:
        started = time.monotonic()
        await bulk_load(fleet, url, args.sessions)
        memory = sum(s.memory for s in shards(ports))
        print(
            f"index loaded in {time.monotonic() - started:.1f} s: {args.sessions:,} sessions, "
            f"{args.sessions * BLOCKS_PER_SESSION:,} entries, used_memory {memory / 2**20:,.0f}"
            f" MiB ({memory / (args.sessions * BLOCKS_PER_SESSION):.1f} bytes/entry)",
            flush=True,
        )
        with contextlib.ExitStack() as stack:
            ingest = []
            ingest_logs = []
            publishers = fleet.publishers()
            for i in range(args.ingest_processes):
                metrics_port = free_port()
                ingest_logs.append(stack.enter_context(
                    service(url, publishers[i :: args.ingest_processes], free_port(),
                            "--no-api", "--metrics-port", str(metrics_port), quota=None)
                ))  # fmt: skip
                ingest.append(f"http://127.0.0.1:{metrics_port}")
            log = stack.enter_context(service(url, [], port, "--no-ingest", quota=None))
            try:
                async with asyncio.timeout(BUILD_SECONDS):
                    await until_built(base, args.sessions * BLOCKS_PER_SESSION, args.workers)
            except TimeoutError:
                print(log.read_text()[-4000:], file=sys.stderr)
                raise
            print(f"every worker live {time.monotonic() - started:.1f} s", flush=True)
            bases = [base, *ingest]
            async with ingesting(fleet, args.ingest_rate), asyncio.timeout(BUILD_SECONDS):
                await caught_up(fleet, ingest, args.ingest_rate)
            print(await asyncio.to_thread(warm_up, ingest, ingest_logs), flush=True)
            async with measuring(args.lock):
                quiet = await point(args, fleet, bases, port, ports, args.quiet_rps, "no ingest")
                async with ingesting(fleet, args.ingest_rate):
                    await asyncio.sleep(args.warmup)
                    return [quiet, *await loaded(args, fleet, bases, port, ports)]
    finally:
        await fleet.close()


@contextlib.asynccontextmanager
async def measuring(lock: str | None) -> AsyncIterator[None]:
    """Hold `lock` (flock, exclusive) while measuring, if given: the build before it is
    long and measures nothing but its own time, so other benches may run meanwhile."""
    if lock is None:
        yield
        return
    held = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        waited = time.monotonic()
        await asyncio.to_thread(fcntl.flock, held, fcntl.LOCK_EX)
        print(
            f"{lock} held after {time.monotonic() - waited:.0f} s; load average "
            f"{os.getloadavg()[0]:.2f}, {time.strftime('%H:%M:%S', time.gmtime())} UTC",
            flush=True,
        )
        yield
        print(f"load average {os.getloadavg()[0]:.2f} at the end", flush=True)
    finally:
        os.close(held)


async def loaded(
    args: argparse.Namespace, fleet: Fleet, bases: list[str], port: int, ports: list[int]
) -> list[dict[str, Any]]:
    """Every rps point of every run (the steady ingest running)."""
    rates = [float(r) for r in args.rps.split(",")]
    results = []
    for n in range(args.runs):
        for rps in rates if n % 2 == 0 else rates[::-1]:
            results.append(await point(args, fleet, bases, port, ports, rps, str(n + 1)))
    return results


@contextlib.asynccontextmanager
async def ingesting(fleet: Fleet, rate: float) -> AsyncIterator[None]:
    """The publishers' steady load while inside."""
    steady = asyncio.create_task(fleet.steady(rate))
    try:
        yield
    finally:
        steady.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await steady


async def point(
    args: argparse.Namespace,
    fleet: Fleet,
    bases: list[str],
    port: int,
    ports: list[int],
    rps: float,
    run: str,
) -> dict[str, Any]:
    """One point: an idle window (no requests), then the load at `rps`, each measured;
    `run` names it in the output ("no ingest": the steady ingest is not running)."""
    async with asyncio.timeout(BUILD_SECONDS):
        await settled(bases[0])
    idle = await idle_window(ports, bases[1:], args.idle)
    events = await asyncio.to_thread(applied, bases[1:])
    waits_before = await asyncio.to_thread(connection_waits, bases[0])
    await asyncio.to_thread(slowlog_reset, ports)
    before = await asyncio.to_thread(shards, ports)
    started = time.monotonic()
    report = await measure(args, fleet, bases, port, rps, None)
    after = await asyncio.to_thread(shards, ports)
    report["slow_commands"] = await asyncio.to_thread(slow_commands, ports)
    wall = time.monotonic() - started
    events = await asyncio.to_thread(applied, bases[1:]) - events
    load = window(before, after, wall, events)
    waits_after = await asyncio.to_thread(connection_waits, bases[0])
    commands, cpu_us = api_share(load, idle, report["sent"])
    report |= {
        "rps": rps,
        "run": run,
        "point": f"{rps:g}" if run != "no ingest" else f"{rps:g}, no ingest",
        "workers": args.workers,
        "commands_per_request": commands,
        "redis_us_per_request": cpu_us,
        "api_us_per_request": report["cpu"]["service"] * wall / report["sent"] * 1e6,
        "idle_commands_per_s": idle.calls / idle.seconds,
        "idle_per_apply": per_apply(idle),
        "shard_ops": load.ops,
        "shard_memory_mib": [m / 2**20 for m in load.memory],
        "api_connection_waits": {
            "waits": waits_after[0] - waits_before[0],
            "seconds": waits_after[1] - waits_before[1],
        },
    }
    report["cpu"]["redis"] = load.cpu / wall
    report["cpu"]["others"] -= report["cpu"]["redis"]  # measure() counted Redis as others
    print(line(report), flush=True)
    print(redis_line(report), flush=True)
    print(waits_line(report), flush=True)
    print(stalls_line(report), flush=True)
    print(slow_line(report), flush=True)
    for kind in report["kinds"].values():
        for why, body in kind["error_examples"].items():
            print(f"    {why}: {body}", flush=True)
    return report


def slow_line(r: dict[str, Any]) -> str:
    """The commands the shards ran for 5 ms or longer during the point: name, count, longest."""
    named = ", ".join(
        f"{name} x{len(ms)} (longest {max(ms):.1f} ms)"
        for name, ms in sorted(r["slow_commands"].items(), key=lambda kv: -max(kv[1]))
    )
    return f"    commands over {SLOW_MICROSECONDS / 1000:g} ms on the shards: {named or 'none'}"


def waits_line(r: dict[str, Any]) -> str:
    """The API process's store calls that waited for a connection during the point."""
    waits = r["api_connection_waits"]
    mean = f", {waits['seconds'] / waits['waits'] * 1000:.2f} ms each" if waits["waits"] else ""
    return (
        f"    API connection waits: {waits['waits']:.0f} store calls waited for a connection, "
        f"{waits['seconds']:.3f} s in all{mean}"
    )


def redis_line(r: dict[str, Any]) -> str:
    ops = "/".join(f"{o:,.0f}" for o in r["shard_ops"])
    memory = "/".join(f"{m:,.0f}" for m in r["shard_memory_mib"])
    return (
        f"    redis: {r['commands_per_request']:.1f} commands/request, "
        f"{r['redis_us_per_request']:.0f} us CPU/request, API {r['api_us_per_request']:.0f} us "
        f"CPU/request (idle window "
        f"{r['idle_commands_per_s']:,.0f} commands/s{idle_applies(r)}); per shard ops/s {ops}, "
        f"used_memory MiB {memory}"
    )


def idle_applies(r: dict[str, Any]) -> str:
    idle = r["idle_per_apply"]
    cores = f", Redis {idle['redis_cores']:.3f} and ingest {idle['ingest_cores']:.3f} cores"
    if "applies_per_s" not in idle:
        return cores
    return cores + (
        f", {idle['applies_per_s']:,.0f} applies/s of {idle['block_events_per_apply']:.1f} "
        f"block-events, {idle['redis_us']:.0f} us Redis and {idle['ingest_us']:.0f} us ingest "
        "CPU per apply"
    )


def medians(results: list[dict[str, Any]], redis_kind: str) -> None:
    """The table of bench/README.md: medians over runs of each point (errors: the sum)."""
    print("\nmedians over runs:")
    print("| Redis | workers | rps | achieved | route p50 | route p99 | route max | session p50 "
          "| session p99 | session max | errors | ingest/s | commands/request "
          "| Redis CPU us/request | API CPU us/request | shard ops/s | shard MiB | API CPU "
          "| ingest CPU | Redis CPU | others' CPU | idle applies/s | idle Redis / ingest us "
          "per apply |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"
          "---:|---:|---:|---:|---:|---|")  # fmt: skip
    for name in dict.fromkeys(r["point"] for r in results):
        runs = [r for r in results if r["point"] == name]
        cells = [redis_kind, f"{runs[0]['workers']:,}", name, *point_cells(runs)]
        shard_count = len(runs[0]["shard_ops"])
        ops = [statistics.median(r["shard_ops"][i] for r in runs) for i in range(shard_count)]
        memory = [runs[-1]["shard_memory_mib"][i] for i in range(shard_count)]
        cells += [
            f"{median_of(runs, 'commands_per_request'):.1f}",
            f"{median_of(runs, 'redis_us_per_request'):.0f}",
            f"{median_of(runs, 'api_us_per_request'):,.0f}",
            " / ".join(f"{o:,.0f}" for o in ops),
            " / ".join(f"{m:,.0f}" for m in memory),
            *cpu_cells(runs),
            *idle_cells(runs),
        ]
        print("| " + " | ".join(cells) + " |")


def idle_cells(runs: list[dict[str, Any]]) -> list[str]:
    """The idle windows' applies/s and Redis / ingest CPU per apply: medians over runs."""
    idle = [r["idle_per_apply"] for r in runs if "applies_per_s" in r["idle_per_apply"]]
    if not idle:
        return ["-", "-"]
    rate, redis_us, ingest_us = (
        statistics.median(i[key] for i in idle)
        for key in ("applies_per_s", "redis_us", "ingest_us")
    )
    return [f"{rate:,.0f}", f"{redis_us:.0f} / {ingest_us:.0f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", choices=["cluster", "standalone"], default="cluster")
    parser.add_argument("--workers", type=int, default=1_000)
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--rps", default="100,300,500", help="comma-separated request rates")
    parser.add_argument("--duration", type=float, default=15, help="seconds per point")
    parser.add_argument("--idle", type=float, default=8, help="seconds of the idle window")
    parser.add_argument(
        "--quiet-rps", type=float, default=300, help="rate of the point without ingest"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of every point")
    parser.add_argument("--ingest-rate", type=float, default=10_000, help="block-events/s")
    parser.add_argument("--ingest-processes", type=int, default=1)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--lock", help="a file to flock while measuring (after the build)")
    parser.add_argument("--warmup", type=float, default=5, help="seconds of ingest before")
    args = parser.parse_args()
    configure_logging("warning", "console")
    with servers(args.redis) as (url, ports):
        results = asyncio.run(run(args, url, ports))
    medians(results, args.redis)


if __name__ == "__main__":
    main()
