"""What does one redis-py command cost the client, with Python 3.11's `asyncio.wait_for` on
its send path and with store/redis/transport.py's `keep_cancellations` replacement?

Run: `.venv/bin/python bench/redis_send.py [--commands 10000] [--runs 5]` (see
bench/README.md). Starts its own redis-server (as ingest_redis.py does), then times GETs one
after another on one client with a socket timeout, in this process's CPU time, the two
send paths alternating per run; prints the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from types import ModuleType

import redis.asyncio.connection
from ingest_redis import redis_server
from redis.asyncio import Redis

from kvsi.store.redis.transport import keep_cancellations

PATHS = ("asyncio.wait_for", "keep_cancellations")


async def per_command(client: Redis, commands: int) -> float:
    """µs of this process's CPU per GET."""
    started = time.process_time()
    for _ in range(commands):
        await client.get("k")
    return (time.process_time() - started) / commands * 1e6


async def measure(port: int, commands: int, runs: int) -> dict[str, list[float]]:
    names = vars(redis.asyncio.connection)
    stock: ModuleType = names["asyncio"]
    keep_cancellations()
    fixed: ModuleType = names["asyncio"]
    client = Redis(port=port, socket_timeout=5)
    figures: dict[str, list[float]] = {path: [] for path in PATHS}
    try:
        await per_command(client, commands // 5)
        for _ in range(runs):
            for path, module in zip(PATHS, (stock, fixed), strict=True):
                names["asyncio"] = module
                figures[path].append(await per_command(client, commands))
    finally:
        names["asyncio"] = fixed
        await client.aclose()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commands", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with redis_server(512) as port:
        figures = asyncio.run(measure(port, args.commands, args.runs))
    for path, runs in figures.items():
        listed = ", ".join(f"{x:.1f}" for x in runs)
        print(f"{path:<20} {statistics.median(runs):6.1f} µs per GET (runs: {listed})")


if __name__ == "__main__":
    main()
