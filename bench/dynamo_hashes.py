"""What does indexing Dynamo's hashes cost? Ingest rate and bytes per entry with the Dynamo
API's tokens hashes on (stores decoded with their token ids, hashed, and each block linked
as a Dynamo edge) against off, on the memory store and on Redis.

Run: `.venv/bin/python bench/dynamo_hashes.py` (see bench/README.md). The simulator's agent
traffic (real token ids) and DESIGN.md's small batches; medians of several runs on one core;
memory as Python's traced allocations of the store (memory) and as `used_memory` (Redis,
its own redis-server on a free loopback port), both per index entry.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import time
import tracemalloc

import redis
from ingest_memory import agentic, block_events, pin_to_one_core, small_events
from ingest_redis import redis_server

from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, WorkerKey
from kvsi.store.redis import RedisStore
from kvsi.subscriber.decode import ingest_decoder

WORKER = WorkerKey("pod-a", 0)


def ingest(payloads: list[bytes], tokens: bool) -> tuple[float, MemoryStore]:
    """Seconds to decode and apply every batch into a fresh memory store, and the store."""
    decoder = ingest_decoder(tokens=tokens)
    store = MemoryStore()
    started = time.perf_counter()
    for seq, p in enumerate(payloads):
        decoded = decoder.decode(p)
        store.apply_now(WORKER, Batch(seq, decoded.ts, decoded.events))
    return time.perf_counter() - started, store


def entries(store: MemoryStore) -> int:
    return sum(len(part.holders) for part in store._workers[WORKER].index.by_pid.values())


def memory_bytes(payloads: list[bytes], tokens: bool) -> tuple[int, int, int]:
    """Traced bytes the store holds after ingest, its entries, and its Dynamo edges."""
    gc.collect()
    tracemalloc.start()
    _, store = ingest(payloads, tokens)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held, entries(store), len(store._workers[WORKER].index.tokens)


async def redis_bytes(port: int, payloads: list[bytes], tokens: bool, prefix: str) -> float:
    """`used_memory` grown by ingesting `payloads` under `prefix`, per index entry."""
    raw = redis.Redis(port=port)
    decoder = ingest_decoder(tokens=tokens)
    batches = []
    for seq, p in enumerate(payloads):
        decoded = decoder.decode(p)
        batches.append(Batch(seq, decoded.ts, decoded.events))
    before = int(raw.info("memory")["used_memory"])
    store = RedisStore.from_url(f"redis://127.0.0.1:{port}?prefix={prefix}")
    started = time.perf_counter()
    for start in range(0, len(batches), 64):
        await store.apply_many(WORKER, batches[start : start + 64])
    seconds = time.perf_counter() - started
    used = int(raw.info("memory")["used_memory"]) - before
    n = sum(1 for _ in raw.scan_iter(f"{prefix}:*", count=1000))
    await store.close()
    _, memory = ingest(payloads, tokens)
    held = entries(memory)
    events = block_events(payloads)
    print(
        f"  redis {'on ' if tokens else 'off'}: {used / held:8.1f} bytes/entry"
        f" ({used:,} bytes, {held:,} entries, {n:,} keys);"
        f" decoded, then applied at {events / seconds:,.0f} block-events/s"
    )
    return used / held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)))
    parser.add_argument("--no-redis", action="store_true")
    args = parser.parse_args()
    pinned = pin_to_one_core(None if args.cpu < 0 else args.cpu)
    print(f"{pinned}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, make in (("agentic", agentic), ("small", small_events)):
        payloads = make(args.batches, args.seed)
        n = block_events(payloads)
        rates = {
            tokens: statistics.median(n / ingest(payloads, tokens)[0] for _ in range(args.runs))
            for tokens in (False, True)
        }
        print(
            f"{name}: {n:,} block-events; ingest off {rates[False]:,.0f}/s, on "
            f"{rates[True]:,.0f}/s ({rates[True] / rates[False]:.2f}x), medians of {args.runs}"
        )
        off, held, _ = memory_bytes(payloads, False)
        on, _, edges = memory_bytes(payloads, True)
        print(
            f"  memory: {held:,} entries, {edges:,} Dynamo edges; off {off / held:.1f} "
            f"bytes/entry, on {on / held:.1f} (+{(on - off) / held:.1f})"
        )
        if not args.no_redis:
            with redis_server(512) as port:
                off_r = asyncio.run(redis_bytes(port, payloads, False, f"{name}-off"))
                on_r = asyncio.run(redis_bytes(port, payloads, True, f"{name}-on"))
                print(f"  redis: +{on_r - off_r:.1f} bytes/entry with the edges")


if __name__ == "__main__":
    main()
