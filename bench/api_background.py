"""How long do the API process's background passes over the fleet hold its event loop?

Run: `.venv/bin/python bench/api_background.py [--redis cluster|standalone] [--workers 1000]`
(see bench/README.md "api_background.py"). Starts its own redis-server or 3-master cluster
(as fleet_latency.py does), registers `--workers` workers through a writer `RedisStore`
(a status with a model, then one batch of `--sessions` sessions each), then times, in a
reader `RedisStore` as an API process holds one, each pass a serving process runs besides
its requests:

- `states, one changed`: `worker_states()` after one worker's state changed (a writer's
  `set_status`), as a route's first read after it does; `models, one changed`:
  `worker_models()` right after, as a route restricted to a model does;
- `states, none changed`: the same once the cache expired with no change;
- `index gauges`: one pass of the index metrics refresher (`refresh_index_metrics`);
- `janitor`: the janitor's look for disconnected workers (`kvsi.janitor._gone`).

Per pass, medians of `--runs`: its wall time, the longest the event loop went without
running a 1 ms ticker task (what a request arriving then waits, at least), the ticks it
missed, Redis commands (INFO commandstats) and this process's CPU. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import redis
from directory_reads import server_totals
from fleet_latency import servers

from kvsi.janitor import _gone
from kvsi.loops import share_the_interpreter
from kvsi.serve import refresh_index_metrics
from kvsi.store.model import Batch, EntriesStored, WorkerKey, WorkerState, WorkerStatus
from kvsi.store.redis import RedisStore

TICK = 0.001
"""The ticker's sleep: a request's wait is at least the longest gap between its runs."""


class Ticker:
    """A task that sleeps `TICK` in a loop and keeps the longest gap between its runs."""

    def __init__(self) -> None:
        self.longest = 0.0
        self.late = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(TICK)
            now = time.perf_counter()
            gap = now - last - TICK
            self.longest = max(self.longest, gap)
            self.late += gap > 0.005
            last = now

    def __enter__(self) -> Ticker:
        self._task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def fill(writer: RedisStore, workers: list[WorkerKey], sessions: int) -> None:
    """Each worker live (a model), then one batch of its own `sessions` sessions."""
    for w in workers:
        await writer.set_status(w, WorkerStatus(WorkerState.LIVE, 1.0, model="m"))
        events = [
            EntriesStored([hash((w.pod, s, b)) & (2**63 - 1) for b in range(4)], "GPU", 0,
                          f"{w.pod}-s{s}", None)
            for s in range(sessions)
        ]  # fmt: skip
        await writer.apply(w, Batch(0, 2.0, list(events)))


async def timed(nodes: list[redis.Redis], run: Callable[[], Awaitable[object]]) -> dict[str, float]:
    calls0, _ = server_totals(nodes)
    cpu0 = time.process_time()
    with Ticker() as ticker:
        await asyncio.sleep(0.01)
        started = time.perf_counter()
        await run()
        wall = time.perf_counter() - started
        await asyncio.sleep(0.01)
    cpu = time.process_time() - cpu0
    calls1, _ = server_totals(nodes)
    return {
        "wall_ms": wall * 1e3,
        "hold_ms": ticker.longest * 1e3,
        "late": ticker.late,
        "commands": calls1 - calls0 - 2 * len(nodes),
        "cpu_ms": cpu * 1e3,
    }


async def one_size(url: str, ports: list[int], workers: int, args: argparse.Namespace) -> None:
    nodes = [redis.Redis(port=port) for port in ports]
    for node in nodes:
        node.flushall()
    keys = [WorkerKey(f"pod-{i}", 0) for i in range(workers)]
    writer = RedisStore.from_url(url)
    reader = RedisStore.from_url(f"{url}&registry_ttl={args.ttl}")
    await fill(writer, keys, args.sessions)
    await reader.worker_states()
    await reader.worker_models()

    async def after_ttl() -> None:
        await asyncio.sleep(args.ttl * 1.5)

    async def one_changed() -> None:
        await reader.worker_states()

    async def models() -> None:
        await reader.worker_models()

    async def gauges() -> None:
        await refresh_index_metrics(reader)

    async def janitor() -> None:
        await _gone(reader, time.time() - 60)

    rows: dict[str, list[dict[str, float]]] = {}
    for run in range(args.runs):
        changed = keys[run % workers]
        state = WorkerState.DEGRADED if run % 2 == 0 else WorkerState.LIVE
        await writer.set_status(changed, WorkerStatus(state, 3.0 + run, model="m"))
        await after_ttl()
        rows.setdefault("states, one changed", []).append(await timed(nodes, one_changed))
        rows.setdefault("models, one changed", []).append(await timed(nodes, models))
        await after_ttl()
        rows.setdefault("states, none changed", []).append(await timed(nodes, one_changed))
        rows.setdefault("index gauges", []).append(await timed(nodes, gauges))
        rows.setdefault("janitor", []).append(await timed(nodes, janitor))
    name = "cluster" if len(nodes) > 1 else "redis"
    for kind, runs in rows.items():
        fields = ("wall_ms", "hold_ms", "late", "commands", "cpu_ms")
        cells = [statistics.median(r[f] for r in runs) for f in fields]
        print(
            f"| {name} | {workers:,} | {kind} | {cells[0]:.1f} | {cells[1]:.1f} | {cells[2]:.0f} "
            f"| {cells[3]:.0f} | {cells[4]:.1f} |",
            flush=True,
        )
    await writer.close()
    await reader.close()


async def main_async(args: argparse.Namespace) -> None:
    print(
        "| store | workers | pass | wall ms | longest loop hold ms | ticks over 5 ms "
        "| Redis commands | client CPU ms |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    with servers(args.redis) as (url, ports):
        for workers in (int(w) for w in args.workers.split(",")):
            await one_size(url, ports, workers, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", choices=("cluster", "standalone"), default="cluster")
    parser.add_argument("--workers", default="10,1000", help="fleet sizes, comma-separated")
    parser.add_argument("--sessions", type=int, default=4, help="sessions per worker")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--ttl", type=float, default=0.2, help="the reader's registry_ttl (s)")
    share_the_interpreter()  # as `kvsi serve` does
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
