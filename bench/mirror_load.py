"""How long a Redis writer takes to load its workers' mirrors: what a restarted ingest process
(central, or a sidecar) pays before it applies a worker's next batch.

Run: `.venv/bin/python bench/mirror_load.py [--redis standalone|cluster] [--workers 100]
[--sessions 20000] [--runs 3]` (see bench/README.md "mirror_load.py"). Builds fleet_latency.py's
index (`--sessions` sessions of a 10-block chain over `--workers` workers, through the real
apply path), then per run a new `RedisStore` loads every worker's mirror, one after the other,
as a writer does on each worker's first batch. Reports wall and CPU seconds per run and µs of
this process's CPU per entry (medians). Needs redis-server (and redis-cli for a cluster).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

from fleet_latency import bulk_load, servers
from route_latency import Fleet

from kvsi.logs import configure_logging
from kvsi.store.model import WorkerKey
from kvsi.store.redis import RedisStore

BLOCKS_PER_SESSION = 10
"""fleet_latency.py's prefill: each session a 10-block chain."""


async def load_all(url: str, workers: int) -> tuple[float, float]:
    """Wall and CPU seconds for a new store to load every worker's mirror (the writer's own
    load, private: every public write would add its own work)."""
    store = RedisStore.from_url(url)
    try:
        wall, cpu = time.monotonic(), time.process_time()
        for w in range(workers):
            await store._load(store._writer(WorkerKey(f"vllm-{w}", 0)))
        return time.monotonic() - wall, time.process_time() - cpu
    finally:
        await store.close()


async def run(args: argparse.Namespace) -> None:
    entries = args.sessions * BLOCKS_PER_SESSION
    with servers(args.redis) as (url, _):
        fleet = Fleet(args.workers)
        await fleet.start()
        try:
            started = time.monotonic()
            await bulk_load(fleet, url, args.sessions)
            print(f"index built: {entries:,} entries in {time.monotonic() - started:.1f} s")
            results = [await load_all(url, args.workers) for _ in range(args.runs)]
        finally:
            await fleet.close()
    for wall, cpu in results:
        print(f"run: {wall:.2f} s wall, {cpu:.2f} s CPU")
    wall = statistics.median(r[0] for r in results)
    cpu = statistics.median(r[1] for r in results)
    print(
        f"{args.redis}, {args.workers} workers, {entries:,} entries: load {wall:.2f} s wall, "
        f"{cpu:.2f} s CPU, {cpu / entries * 1e6:.2f} us CPU per entry (medians of {args.runs})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", choices=("standalone", "cluster"), default="standalone")
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    configure_logging("warning", "console")
    asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
