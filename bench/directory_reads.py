"""Does a session lookup or a prefix match cost the same at 1,000 workers as at 10?

Run: `.venv/bin/python bench/directory_reads.py [--redis standalone|cluster]` (see
bench/README.md "directory_reads.py"). Starts its own redis-server or 3-master cluster (as
fleet_latency.py does). For each fleet size: FLUSHALL, then
`--sessions` sessions of a 10-block prompt of their own (the first block stored with no
parent, as vLLM stores a prompt's start), session k on worker k % workers, written through
`RedisStore.apply`; then `--queries` `get_session` and as many `match_prefix` of a session's
prompt (its 10 blocks and 2 unknown ones) over every worker, as a route asks. Prints per
kind: Redis commands per request (INFO commandstats, scripts' own commands included), Redis
CPU per request, this process's CPU per request, p50/p99 latency. The same fill and queries
on the memory store follow (`memory` rows: this process's CPU is the whole cost). Asserts
nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable

import redis
from fleet_latency import servers

from kvsi.store.base import IndexStore
from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, EntriesStored, WorkerKey
from kvsi.store.redis import RedisStore

BLOCKS = 10


def prompt(session: int) -> list[int]:
    rng = random.Random(session)
    return [rng.getrandbits(64) for _ in range(BLOCKS)]


async def fill(store: IndexStore, workers: list[WorkerKey], sessions: int) -> None:
    """Each worker's sessions in batches of 64 stores."""
    for w, worker in enumerate(workers):
        mine = range(w, sessions, len(workers))
        for seq, start in enumerate(range(0, len(mine), 64)):
            events = [
                EntriesStored(prompt(k), "GPU", 0, f"sess-{k}", None)
                for k in mine[start : start + 64]
            ]
            await store.apply(worker, Batch(seq, 1000.0 + seq, list(events)))


def server_totals(nodes: list[redis.Redis]) -> tuple[int, float]:
    """(commands run, CPU seconds) of every node so far, this call's own two INFO commands
    a node included."""
    calls, cpu = 0, 0.0
    for node in nodes:
        calls += sum(int(v["calls"]) for v in node.info("commandstats").values())
        info = node.info("cpu")
        cpu += float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return calls, cpu


async def measure(
    nodes: list[redis.Redis], requests: list[Callable[[], Awaitable[object]]]
) -> dict[str, float]:
    """Per request; without `nodes` (the memory store) no server figures (0)."""
    latencies = []
    calls0, cpu0 = server_totals(nodes)
    own0 = time.thread_time()
    for request in requests:
        started = time.perf_counter()
        await request()
        latencies.append(time.perf_counter() - started)
    own = time.thread_time() - own0
    calls1, cpu1 = server_totals(nodes)
    n = len(requests)
    latencies.sort()
    return {
        "commands": (calls1 - calls0 - 2 * len(nodes)) / n,  # the first server_totals' INFOs
        "redis_us": (cpu1 - cpu0) / n * 1e6,
        "client_us": own / n * 1e6,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": latencies[int(0.99 * (n - 1))] * 1e3,
    }


async def one_size(
    redis_at: tuple[str, list[int]] | None, workers: int, sessions: int, queries: int, seed: int
) -> None:
    """One fleet size on Redis at (URL, every node's port), or on the memory store (None)."""
    nodes = [] if redis_at is None else [redis.Redis(port=port) for port in redis_at[1]]
    keys = [WorkerKey(f"pod-{i}", 0) for i in range(workers)]
    store: IndexStore
    reader: IndexStore
    if redis_at is None:
        store = reader = MemoryStore()
    else:
        for node in nodes:
            node.flushall()
        store = RedisStore.from_url(redis_at[0])
        reader = RedisStore.from_url(redis_at[0])
    await fill(store, keys, sessions)
    rng = random.Random(seed)
    picks = [rng.randrange(sessions) for _ in range(queries)]
    await reader.get_session("warm-up")
    await reader.match_prefix(prompt(0), None)

    def lookup(k: int) -> Callable[[], Awaitable[object]]:
        return lambda: reader.get_session(f"sess-{k}")

    def match(k: int) -> Callable[[], Awaitable[object]]:
        hashes = [*prompt(k), rng.getrandbits(64), rng.getrandbits(64)]
        return lambda: reader.match_prefix(hashes, None)

    for kind, make in (("session", lookup), ("prefix", match)):
        row = await measure(nodes, [make(k) for k in picks])
        server = f"{row['commands']:.1f} | {row['redis_us']:.0f}" if nodes else "- | -"
        name = "memory" if redis_at is None else "cluster" if len(nodes) > 1 else "redis"
        print(
            f"| {name} | {workers:,} | {kind} | {server} "
            f"| {row['client_us']:.0f} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} |",
            flush=True,
        )
    await store.close()
    await reader.close()


async def main_async(args: argparse.Namespace) -> None:
    print(
        "| store | workers | request | Redis commands/request | Redis CPU us/request "
        "| client CPU us/request | p50 ms | p99 ms |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    sizes = [int(w) for w in args.workers.split(",")]
    with servers(args.redis, 512) as redis_at:
        for workers in sizes:
            await one_size(redis_at, workers, args.sessions, args.queries, args.seed)
    for workers in sizes:
        await one_size(None, workers, args.sessions, args.queries, args.seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", choices=["standalone", "cluster"], default="standalone")
    parser.add_argument("--workers", default="10,100,1000")
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
