"""What does a Redis index cost per entry, per session and per block?

Run: `.venv/bin/python bench/redis_memory_shape.py` (see bench/README.md
"redis_memory_shape.py"). Starts its own redis-server (as ingest_redis.py does). Three fills
of the same `--entries` resident (session, block) entries over `--workers` workers through
`RedisStore.apply`, batches of 64 stores: sessions of `--blocks` blocks of their own, sessions
of 10x as many, sessions of `--blocks` blocks where `--sharing` sessions store the same
blocks (one stores them, the others report them), each store continuing a prompt (a parent
named); then the first fill with every store starting a prompt (no parent: a block
directory member each). Each: `used_memory` after minus before, and the change-feed
streams' share (`MEMORY USAGE`). Prints the bytes of each fill without the feed, the three
costs that explain the first three (per entry, per session, per distinct block) and the
fourth's extra per prompt start.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import random

import redis
from ingest_redis import redis_server, store_at

from kvsi.store.model import Batch, EntriesStored, WorkerKey


def sessions_of(entries: int, blocks: int, sharing: int, seed: int) -> list[list[int]]:
    """Each session's block hashes: `sharing` consecutive sessions hold the same blocks."""
    rng = random.Random(seed)
    chains: list[list[int]] = []
    while len(chains) * blocks < entries:
        chain = [rng.getrandbits(64) for _ in range(blocks)]
        chains.extend([chain] * sharing)
    return chains


CONTINUED = 1
"""The parent every store names unless it starts a prompt: a block the worker need not hold
(the store then continues a prompt, and asserts nothing in the block directory)."""


async def fill(port: int, workers: int, chains: list[list[int]], starts: bool) -> tuple[int, int]:
    """Writes session k on worker (k // 64) % workers, each store starting a prompt (no
    parent) if `starts`; returns (used_memory, feed bytes)."""
    raw = redis.Redis(port=port)
    raw.flushall()
    before = int(raw.info("memory")["used_memory"])
    store = store_at(port)
    keys = [WorkerKey(f"pod-{w}", 0) for w in range(workers)]
    seqs = dict.fromkeys(keys, 0)
    for start in range(0, len(chains), 64):
        worker = keys[(start // 64) % workers]
        events = [
            EntriesStored(chains[k], "GPU", 0, f"sess-{k}", None if starts else CONTINUED)
            for k in range(start, min(start + 64, len(chains)))
        ]
        await store.apply(worker, Batch(seqs[worker], 1000.0 + start, list(events)))
        seqs[worker] += 1
    feed = sum(int(raw.memory_usage(store.worker_keys(k).feed) or 0) for k in keys)
    records = sum(int(raw.xlen(store.worker_keys(k).feed)) for k in keys)
    await store.close()
    used = int(raw.info("memory")["used_memory"]) - before
    print(f"  feed: {records:,} records, {feed / records:,.0f} bytes per record")
    return used, feed


def solve(rows: list[tuple[int, int, int]], totals: list[int]) -> tuple[float, ...]:
    """The costs (per entry, per session, per block) that give each fill its bytes: three
    equations, three unknowns, by Cramer's rule."""

    def det(m: list[list[float]]) -> float:
        (a, b, c), (d, e, f), (g, h, i) = m
        return a * (e * i - f * h) - b * (d * i - f * g) + c * (d * h - e * g)

    matrix = [[float(v) for v in row] for row in rows]

    def replaced(col: int) -> list[list[float]]:
        return [
            [*row[:col], float(t), *row[col + 1 :]] for row, t in zip(matrix, totals, strict=True)
        ]

    return tuple(det(replaced(col)) / det(matrix) for col in range(3))


async def run(args: argparse.Namespace) -> None:
    shapes = [
        ("own blocks", args.blocks, 1, False),
        ("long sessions", args.blocks * 10, 1, False),
        ("shared blocks", args.blocks, args.sharing, False),
        ("own blocks, each session a prompt start", args.blocks, 1, True),
    ]
    rows = []
    with redis_server(args.intset_entries) as port:
        for name, blocks, sharing, starts in shapes:
            chains = sessions_of(args.entries, blocks, sharing, args.seed)
            entries = sum(len(c) for c in chains)
            distinct = len(chains) // sharing * blocks
            print(f"{name}: {entries:,} entries, {len(chains):,} sessions, {distinct:,} blocks")
            used, feed = await fill(port, args.workers, chains, starts)
            rows.append((entries, len(chains), distinct, used - feed))
            print(f"  {used - feed:,} bytes without the feed, {(used - feed) / entries:.1f}/entry")
    per_entry, per_session, per_block = solve([r[:3] for r in rows[:3]], [r[3] for r in rows[:3]])
    per_start = (rows[3][3] - rows[0][3]) / rows[0][1]
    print(
        f"\nbytes per entry {per_entry:.1f}, per session {per_session:.1f}, "
        f"per distinct block {per_block:.1f}, per prompt start {per_start:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--blocks", type=int, default=10, help="blocks per session")
    parser.add_argument("--sharing", type=int, default=4, help="sessions per shared block")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--intset-entries",
        type=int,
        default=4096,
        help="the server's set-max-intset-entries (deploy/README.md recommends 4096)",
    )
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
