"""Change-feed freshness end to end from vLLM's own publishers: how long from an engine's
`publish` to the batch's change showing in `GET /v1/watch`, at a fixed block-event rate?

Run: `.venv/interop/bin/python bench/freshness.py [--store redis,cluster,memory]
[--rate 100000] [--workers 16] [--processes 4] [--batch-events 64] [--seconds 20]
[--trees A,B]` (see bench/README.md; the interop virtualenv has vLLM 0.33: `make
.venv/interop/bin/.installed`).

Per store, over loopback TCP:

1. `--processes` publisher processes (this script with `publish`), each holding its share
   of `--workers` vLLM 0.33 `ZmqEventPublisher`s made by `EventPublisherFactory.create` from
   a `KVEventsConfig` as tests/interop/engines.py makes them (PUB and replay ROUTER bound on
   `tcp://*:PORT`, the pod's topic). Each worker publishes `KVEventBatch(ts=time.time(),
   ...)` at a fixed pace: rate / (workers x batch-events) batches a second, each one
   `BlockStored` of batch-events / 2 new blocks (a session's next blocks, with their token
   ids, `session_id` set) and, once the worker holds POOL_BLOCKS, one `BlockRemoved` of as
   many of its oldest blocks (an engine evicting as it fills): batch-events block-events.
2. `kvsi serve --store URL` subscribed to all of them (`KVSI_PUBLISHERS`, defaults
   otherwise): a private redis-server, a private 3-master Redis Cluster
   (tests/redis_servers.py's), or the memory store.
3. This process reads `GET /v1/watch` (every change, no filter, as a router keeping a warm
   view does) and takes, for each batch's record (the changes of one record share its id
   before the last dot), the time its first change arrives minus the batch's `ts` (the
   publisher's clock, the same machine's): publish -> visible in the change feed.

The publishers run WARMUP_SECONDS before the measured `--seconds` (subscriptions connect,
the pools fill); only records of batches published in the measured window count. Printed:
the rate the publishers reached, records seen against batches published, latency
p50/p99/max, kvsi serve's cores, the share of the window's batches it applied within 20 ms
of their engine time (`kvsi_index_delay_seconds`: the latency before the apply, apart from
the change feed's after it), its lost/replayed/gap counters, load averages.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
from ingest_e2e import cpu_seconds, free_port, metric_sum
from ingest_redis import redis_server
from processes import background

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BLOCK_SIZE = 16
POOL_BLOCKS = 2_048
"""Blocks each simulated engine holds before it evicts (its oldest first)."""
SESSIONS = 32
"""Sessions per worker; each batch stores the next blocks of the next one."""
WARMUP_SECONDS = 4.0
START_SECONDS = 1.0
"""Between the go (every publisher process up, kvsi serve ready) and the first batch."""
DRAIN_SECONDS = 10.0
"""Longest wait after the last batch for its record."""


# -- publisher processes --------------------------------------------------------------------


def publish_main(args: argparse.Namespace) -> None:
    """One publisher process: its workers' ZmqEventPublishers at a fixed pace."""
    from vllm.config.kv_events import KVEventsConfig
    from vllm.distributed.kv_events import (
        BlockRemoved,
        BlockStored,
        EventPublisherFactory,
        KVEventBatch,
    )

    pods: list[str] = args.pods.split(",")
    publishers = []
    bound = []
    for pod in pods:
        # tcp://*:0: vLLM binds a free port on VLLM_HOST_IP (loopback here) and says which.
        config = KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint="tcp://*:0",
            replay_endpoint="tcp://*:0",
            topic=f"kv@{pod}@model",
        )
        publisher = EventPublisherFactory.create(config, 0)
        publishers.append(publisher)
        used = publisher.get_publisher_config()
        bound.append(
            {"pod": pod, "endpoint": used.endpoint, "replay_endpoint": used.replay_endpoint}
        )
    per_store = args.batch_events // 2
    tokens = list(range(per_store * BLOCK_SIZE))
    next_hash = [(n + 1) << 40 for n in range(len(pods))]
    held: list[list[int]] = [[] for _ in pods]
    last: list[dict[int, int]] = [{} for _ in pods]
    interval = 1.0 / args.batch_rate
    print("ready " + json.dumps(bound), flush=True)
    go = Path(args.go)
    while not go.exists():
        time.sleep(0.01)
    args.begin = float(go.read_text())
    end = args.begin + args.seconds
    while time.time() < args.begin:
        time.sleep(min(0.01, args.begin - time.time()))
    tick = 0
    sent = 0
    while True:
        due = args.begin + tick * interval
        if due >= end:
            break
        delay = due - time.time()
        if delay > 0:
            time.sleep(delay)
        for i, publisher in enumerate(publishers):
            first = next_hash[i]
            hashes = list(range(first, first + per_store))
            next_hash[i] = first + per_store
            session = (tick + i) % SESSIONS
            events: list[Any] = [
                BlockStored(
                    block_hashes=hashes,
                    parent_block_hash=last[i].get(session),
                    token_ids=tokens,
                    block_size=BLOCK_SIZE,
                    lora_id=None,
                    medium="GPU",
                    lora_name=None,
                    session_id=f"{pods[i]}-s{session}",
                )
            ]
            last[i][session] = hashes[-1]
            held[i] += hashes
            if len(held[i]) > POOL_BLOCKS:
                evicted, held[i] = held[i][:per_store], held[i][per_store:]
                events.append(BlockRemoved(block_hashes=evicted, medium="GPU"))
            publisher.publish(KVEventBatch(ts=time.time(), events=events))
            sent += 1
        tick += 1
    elapsed = time.time() - args.begin
    time.sleep(1.0)
    for publisher in publishers:
        publisher.shutdown()
    print(json.dumps({"batches": sent, "seconds": elapsed}), flush=True)


# -- the bench ------------------------------------------------------------------------------


@contextlib.contextmanager
def store_url(kind: str) -> Iterator[str]:
    if kind == "memory":
        yield "memory"
    elif kind == "redis":
        with redis_server(512) as port:
            yield f"redis://127.0.0.1:{port}/0"
    else:
        from tests.redis_servers import RedisClusterServers

        cluster = RedisClusterServers()
        try:
            cluster.start()
            yield cluster.url
        finally:
            cluster.remove()


class _Event(msgspec.Struct):
    ts: float


async def watch(port: int, seen: dict[str, tuple[float, float]], stop: asyncio.Event) -> None:
    """Every record's first change: (its batch's ts, its arrival), by record id."""
    decode = msgspec.json.Decoder(_Event).decode
    async with (
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=None) as client,
        client.stream("GET", "/v1/watch") as response,
    ):
        record = ""
        async for line in response.aiter_lines():
            if stop.is_set():
                return
            if line == "event: overflow":
                print("the watcher fell behind: overflow", file=sys.stderr, flush=True)
            if line.startswith("id: "):
                record = line[4:].rpartition(".")[0]
            elif line.startswith("data: ") and record and record not in seen:
                now = time.time()
                with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                    seen[record] = (decode(line[6:]).ts, now)


async def ready(client: httpx.AsyncClient) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get("/readyz")).status_code == 200:
                return
        await asyncio.sleep(0.1)
    raise TimeoutError("kvsi serve did not become ready")


async def one_run(kind: str, url: str, tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    pods = [f"pod-{i}" for i in range(args.workers)]
    batch_rate = args.rate / (args.workers * args.batch_events)
    seconds = WARMUP_SECONDS + args.seconds
    go = Path(tempfile.mkdtemp(prefix="freshness-")) / "go"
    http = free_port()
    serve = [sys.executable, "-m", "kvsi", "serve", "--port", str(http), "--store", url]
    with contextlib.ExitStack() as stack:
        # The publishers first: once they are bound, kvsi serve's outgoing connections
        # cannot take one of their ports.
        children = []
        for p in range(args.processes):
            mine = list(range(p, args.workers, args.processes))
            argv = [
                sys.executable, __file__, "publish",
                "--pods", ",".join(pods[i] for i in mine),
                "--batch-rate", repr(batch_rate), "--batch-events", str(args.batch_events),
                "--go", str(go), "--seconds", repr(seconds),
            ]  # fmt: skip
            loopback = {"VLLM_HOST_IP": "127.0.0.1"}
            children.append(stack.enter_context(background(argv, loopback, "freshness-pub-")))
        deadline = time.monotonic() + 120
        while not all("ready " in log.read_text() for _, log in children):
            if time.monotonic() > deadline or any(c.poll() is not None for c, _ in children):
                for _, log in children:
                    print(log.read_text()[-2000:], file=sys.stderr)
                raise RuntimeError("publisher processes did not start")
            await asyncio.sleep(0.1)
        specs = [
            spec
            for _, log in children
            for line in log.read_text().splitlines()
            if line.startswith("ready ")
            for spec in json.loads(line[6:])
        ]
        env = {"KVSI_PUBLISHERS": json.dumps(specs), "PYTHONPATH": str(tree)}
        proc, serve_log = stack.enter_context(background(serve, env, "freshness-serve-"))
        seen: dict[str, tuple[float, float]] = {}
        stop = asyncio.Event()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{http}", timeout=30) as c:
            await ready(c)
            watcher = asyncio.create_task(watch(http, seen, stop))
            await asyncio.sleep(0.5)  # its subscription made
            begin = time.time() + START_SECONDS
            window = (begin + WARMUP_SECONDS, begin + seconds)
            go.with_suffix(".tmp").write_text(repr(begin))
            go.with_suffix(".tmp").rename(go)
            await asyncio.sleep(max(0.0, window[0] - time.time()))
            cpu0, wall0 = cpu_seconds(proc.pid), time.monotonic()
            first = (await c.get("/metrics")).text
            await asyncio.sleep(max(0.0, window[1] - time.time()))
            cores = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - wall0)
            text = (await c.get("/metrics")).text
            applied = applied_within(first, text, INDEX_BOUND)
            await asyncio.sleep(DRAIN_SECONDS / 5)
            text = (await c.get("/metrics")).text
            stop.set()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await watcher
        reached = []
        for child, child_log in children:
            child.wait(timeout=30)
            lines = child_log.read_text().strip().splitlines()
            done = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
            if not done:
                print(child_log.read_text()[-2000:], file=sys.stderr)
            reached.append(done.get("batches", 0) / max(done.get("seconds", 1.0), 1e-9))
        if not seen:
            print(serve_log.read_text()[-5000:], file=sys.stderr)
    inside = sorted(at - ts for ts, at in seen.values() if window[0] <= ts < window[1])
    notes = ", ".join(
        f"{n.replace('_', ' ')} {metric_sum(text, f'kvsi_fleet_{n}_total'):.0f}"
        for n in ("batches_lost", "queue_overflow", "batches_replayed", "seq_gaps")
    )
    published = batch_rate * args.workers * args.seconds
    return {
        "store": kind,
        "tree": tree.name,
        "offered": sum(reached) * args.batch_events,
        "records": len(inside),
        "published": published,
        "p50": _pct(inside, 0.50),
        "p99": _pct(inside, 0.99),
        "max": inside[-1] if inside else float("nan"),
        "cores": cores,
        "applied": applied,
        "notes": notes,
    }


INDEX_BOUND = "0.02"
"""The bucket of `kvsi_index_delay_seconds` the table reports: the target's 20 ms."""


def applied_within(before: str, after: str, bound: str) -> float:
    """The share of the live batches kvsi serve applied between two scrapes of /metrics
    within `bound` seconds of their engine time (`kvsi_index_delay_seconds`): what of the
    latency is spent before the apply (publisher, network, the stream) and what after it
    (the change feed, the watch)."""
    bucket, le = "kvsi_index_delay_seconds_bucket", f'le="{bound}"'
    count = "kvsi_index_delay_seconds_count"
    total = metric_sum(after, count) - metric_sum(before, count)
    inside = metric_sum(after, bucket, le) - metric_sum(before, bucket, le)
    return inside / total if total else float("nan")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "publish":
        parser = argparse.ArgumentParser()
        parser.add_argument("mode")
        parser.add_argument("--pods", required=True)
        parser.add_argument("--batch-rate", type=float, required=True)
        parser.add_argument("--batch-events", type=int, required=True)
        parser.add_argument("--go", required=True, help="a file that will hold the start time")
        parser.add_argument("--seconds", type=float, required=True)
        publish_main(parser.parse_args())
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", default="redis,cluster")
    parser.add_argument("--rate", type=float, default=100_000, help="block-events/s in all")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--batch-events", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--trees",
        default=str(REPO),
        help="comma-separated source trees: kvsi serve from each in turn, per store",
    )
    args = parser.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    print(f"load average at start {os.getloadavg()}", flush=True)
    print(
        "store | tree | offered block-events/s | records / batches | p50 ms | p99 ms | max ms | "
        "kvsi serve cores | applied <= 20 ms | notes"
    )
    for kind in args.store.split(","):
        for tree in trees:
            with store_url(kind) as url:
                r = asyncio.run(one_run(kind, url, tree, args))
            print(
                f"{r['store']} | {r['tree']} | {r['offered']:,.0f} | "
                f"{r['records']:,} / {r['published']:,.0f} | "
                f"{r['p50'] * 1e3:.1f} | {r['p99'] * 1e3:.1f} | {r['max'] * 1e3:.1f} | "
                f"{r['cores']:.2f} | {r['applied']:.1%} | {r['notes']}",
                flush=True,
            )
    print(f"load average at end {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
