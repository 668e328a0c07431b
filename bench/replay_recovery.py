"""How long does a stream take to recover the batches its publisher buffered before it
started (a sidecar restarted behind a busy engine), on the memory store and on Redis?

Run: `.venv/bin/python bench/replay_recovery.py [--batches 10000] [--runs 3]` (see
bench/README.md). In this process, over loopback TCP: one simulated vLLM publisher (vLLM
0.33's frames, PUB + replay ROUTER, a buffer of `--batches`) publishes `--batches` of
ingest_memory.py's `agentic` payloads before any subscriber exists, so all of them reach the
stream by replay; then one `WorkerStream` (through a `StreamPool`, as `kvsi serve` runs it)
starts on a fresh store, and the clock runs from its start until the store's fence names
the last seq. Redis: a private redis-server (ingest_redis.py's), flushed between runs.
Prints seconds and block-events/s per run and the medians per store.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

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

WORKER = WorkerKey("bench", 0)


async def recover(store: IndexStore, payloads: list[bytes]) -> float:
    """Seconds from the stream's start to the last buffered batch applied."""
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
        spec = PublisherSpec(WORKER.pod, publisher.endpoint, publisher.replay_endpoint)
        pool = StreamPool([spec], store)
        started = time.perf_counter()
        await pool.start()
        try:
            last = len(payloads) - 1
            while True:
                fence = await store.fence(WORKER)
                if fence is not None and fence.seq == last:
                    return time.perf_counter() - started
                await asyncio.sleep(0.01)
        finally:
            await pool.stop()
    finally:
        await publisher.close()


async def run_store(name: str, url: str | None, payloads: list[bytes], runs: int) -> list[float]:
    seconds = []
    for _ in range(runs):
        if url is not None:
            redis.Redis.from_url(url).flushall()
        store: IndexStore = MemoryStore() if url is None else RedisStore.from_url(url)
        try:
            seconds.append(await recover(store, payloads))
        finally:
            await store.close()
        print(f"{name:<7} {seconds[-1]:7.2f} s", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    payloads = agentic(args.batches, args.seed)
    events = block_events(payloads)
    print(f"{args.batches:,} buffered batches, {events:,} block-events")
    results = {"memory": asyncio.run(run_store("memory", None, payloads, args.runs))}
    with redis_server(512) as port:
        url = f"redis://127.0.0.1:{port}/0"
        results["redis"] = asyncio.run(run_store("redis", url, payloads, args.runs))
    for name, seconds in results.items():
        median = statistics.median(seconds)
        print(f"median {name:<7} {median:7.2f} s  {events / median:12,.0f} block-events/s")


if __name__ == "__main__":
    main()
