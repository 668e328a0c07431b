"""How much memory does the embedded store take per resident entry, and how fast does it
apply, as it grows to fleet size in one process?

Run: `.venv/bin/python bench/memory_at_size.py` (see bench/README.md "memory_at_size.py").
Builds the index through the real apply path (msgpack payloads of vLLM 0.33's frames,
`ingest_decoder().decode` + `MemoryStore.apply_now`), a fleet of workers each given its
share of sessions, each session a chain of blocks of its own. At each checkpoint it prints
the entries held, the process's RSS and its growth per entry since the start, the apply
rate since the last checkpoint, and, at the end, the steady rate of the small shape
(`ingest_memory.small_events`) on one worker of the full index. Asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Iterator

from ingest_memory import _encode, block_events, small_events

from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, WorkerKey
from kvsi.subscriber import wire
from kvsi.subscriber.decode import ingest_decoder

SESSIONS_PER_BATCH = 64


def rss_bytes() -> int:
    """This process's resident set (VmRSS), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def prefill(
    workers: int, sessions: int, blocks: int, seed: int
) -> Iterator[tuple[int, bytes, int]]:
    """(worker, payload, entries in it): session n on worker n % workers, its `blocks`
    random hashes in one rooted store, `SESSIONS_PER_BATCH` sessions of a worker a batch."""
    rng = random.Random(seed)
    per_worker = [list(range(w, sessions, workers)) for w in range(workers)]
    rounds = max(len(s) for s in per_worker)
    for start in range(0, rounds, SESSIONS_PER_BATCH):
        for w, mine in enumerate(per_worker):
            chunk = mine[start : start + SESSIONS_PER_BATCH]
            if not chunk:
                continue
            events: list[wire.KVCacheEvent] = [
                wire.BlockStored(
                    block_hashes=[rng.getrandbits(64) for _ in range(blocks)],
                    parent_block_hash=None,
                    token_ids=[],
                    block_size=16,
                    lora_id=None,
                    medium="GPU",
                    lora_name=None,
                    session_id=f"sess-{n}",
                )
                for n in chunk
            ]
            yield w, _encode(events, 1_000.0 + start), len(chunk) * blocks


def build(args: argparse.Namespace, store: MemoryStore, base_rss: int) -> int:
    """Apply the prefill, printing a row at each checkpoint; the batches applied per worker."""
    decoder = ingest_decoder()
    keys = [WorkerKey(f"pod-{w}", 0) for w in range(args.workers)]
    seqs = [0] * args.workers
    checkpoints = sorted(int(c) for c in args.checkpoints.split(","))
    entries = applied_since = 0
    spent = 0.0
    print("| entries | RSS MiB | RSS bytes/entry | apply block-events per CPU s (since last) |")
    print("|---:|---:|---:|---:|")
    for w, payload, count in prefill(args.workers, args.sessions, args.blocks, args.seed):
        started = time.thread_time()
        decoded = decoder.decode(payload)
        store.apply_now(keys[w], Batch(seqs[w], decoded.ts, decoded.events))
        spent += time.thread_time() - started
        seqs[w] += 1
        entries += count
        applied_since += count
        if checkpoints and entries >= checkpoints[0]:
            checkpoints.pop(0)
            gc.collect()
            rss = rss_bytes()
            print(
                f"| {entries:,} | {rss / 2**20:,.0f} | {(rss - base_rss) / entries:,.1f} "
                f"| {applied_since / spent:,.0f} |",
                flush=True,
            )
            applied_since, spent = 0, 0.0
    return max(seqs)


def steady(store: MemoryStore, first_seq: int, batches: int, seed: int) -> float:
    """Block-events/s of the small shape applied to worker pod-0 of the full index."""
    payloads = small_events(batches, seed)
    decoder = ingest_decoder()
    worker = WorkerKey("pod-0", 0)
    started = time.thread_time()
    for i, p in enumerate(payloads):
        decoded = decoder.decode(p)
        store.apply_now(worker, Batch(first_seq + i, 10_000.0 + i, decoded.events))
    return block_events(payloads) / (time.thread_time() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--blocks", type=int, default=10, help="blocks per session")
    parser.add_argument("--checkpoints", default="1000000,2000000,5000000,10000000")
    parser.add_argument("--steady-batches", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    gc.collect()
    base_rss = rss_bytes()
    store = MemoryStore()
    print(
        f"workers {args.workers:,}, sessions {args.sessions:,}, blocks per session "
        f"{args.blocks}, RSS at start {base_rss / 2**20:,.0f} MiB"
    )
    seqs = build(args, store, base_rss)
    rate = steady(store, seqs, args.steady_batches, args.seed)
    print(f"steady small shape on one worker of the full index: {rate:,.0f} block-events per CPU s")


if __name__ == "__main__":
    main()
