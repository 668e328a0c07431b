"""How fast does ingest (decode + apply) run into the memory store, against decode alone and
against Dynamo's RadixTree?

Run: `.venv/bin/python bench/ingest_memory.py` (see bench/README.md). Prints medians of
several runs and the ratios ingest/decode-only and ingest/RadixTree, measured in the same run
on the same payloads, on one core. Without ai-dynamo-runtime (the `peers` extra) it says so
and measures kvsi alone.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from types import ModuleType

import msgspec
from peers import dynamo_llm, missing_line, peer_version, radix_events, time_radix_tree

from kvsi.simulator.engine import SimulatedEngine
from kvsi.simulator.workload import AgenticWorkload
from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, WorkerKey
from kvsi.subscriber import wire
from kvsi.subscriber.decode import ingest_decoder

ENCODER = msgspec.msgpack.Encoder()


def _encode(events: list[wire.KVCacheEvent], ts: float) -> bytes:
    return ENCODER.encode(wire.KVEventBatch(ts=ts, events=events, data_parallel_rank=0))


def small_events(batches: int, seed: int, *, rooted: bool = False) -> list[bytes]:
    """DESIGN.md's shape: 16 stores of 4 blocks per batch, evictions at 50k resident.

    Each store names a random parent, or none if `rooted` (the same hashes either way): a
    peer that drops a store whose parent it does not hold then indexes every block too.
    """
    rng = random.Random(seed)
    sessions = [f"sess-{i}" for i in range(2000)]
    resident: list[int] = []
    out = []
    for b in range(batches):
        events: list[wire.KVCacheEvent] = []
        for _ in range(16):
            hashes = [rng.getrandbits(64) for _ in range(4)]
            resident.extend(hashes)
            parent = rng.getrandbits(64)
            events.append(
                wire.BlockStored(
                    block_hashes=list(hashes),
                    parent_block_hash=None if rooted else parent,
                    token_ids=[rng.randrange(32000) for _ in range(64)],
                    block_size=16,
                    lora_id=None,
                    medium="GPU",
                    lora_name=None,
                    session_id=rng.choice(sessions),
                )
            )
        if len(resident) > 50_000:
            evicted, resident[:] = resident[:64], resident[64:]
            events.append(wire.BlockRemoved(block_hashes=list(evicted), medium="GPU"))
        out.append(_encode(events, 1_000.0 + b))
    return out


def agentic(batches: int, seed: int, num_blocks: int = 50_000) -> list[bytes]:
    """The simulator's agent traffic: shared system prompts, growing turns, reuse reports;
    evictions once the engine's `num_blocks` are full."""
    engine = SimulatedEngine(num_blocks=num_blocks, seed=seed)
    workload = AgenticWorkload(sessions=2000, seed=seed, system_prompts=8)
    out = []
    for b in range(batches):
        events: list[wire.KVCacheEvent] = []
        for _ in range(4):
            request = workload.next_request()
            if request is None:
                break
            events.extend(engine.run_request(request.session_id, request.token_ids))
        out.append(_encode(events, 1_000.0 + b))
    return out


def block_events(payloads: list[bytes]) -> int:
    decoder = msgspec.msgpack.Decoder(wire.KVEventBatch)
    return sum(
        len(e.block_hashes)
        for p in payloads
        for e in decoder.decode(p).events
        if not isinstance(e, wire.AllBlocksCleared)
    )


def time_decode_only(payloads: list[bytes]) -> float:
    """msgspec's typed decode of the full vLLM 0.33 model: the floor ingest cannot beat."""
    decoder = msgspec.msgpack.Decoder(wire.KVEventBatch)
    started = time.perf_counter()
    for p in payloads:
        decoder.decode(p)
    return time.perf_counter() - started


def time_ingest(payloads: list[bytes]) -> float:
    """Decode (ingest decoder) and apply every batch into a fresh memory store."""
    decoder = ingest_decoder()
    store = MemoryStore()
    worker = WorkerKey("pod-a", 0)
    started = time.perf_counter()
    for seq, p in enumerate(payloads):
        decoded = decoder.decode(p)
        store.apply_now(worker, Batch(seq, decoded.ts, decoded.events))
    return time.perf_counter() - started


def pin_to_one_core(cpu: int | None) -> str:
    """Pin this thread (and the threads it starts later: the tree's) to one core."""
    if cpu is None:
        return "not pinned"
    os.sched_setaffinity(0, {cpu})
    return f"pinned to CPU {cpu}"


def measure(
    name: str, payloads: list[bytes], runs: int, llm: ModuleType | None
) -> dict[str, float | int | str]:
    """Medians of `runs` rounds, each timing decode-only, kvsi ingest and the tree in turn."""
    n = block_events(payloads)
    row: dict[str, float | int | str] = {"workload": name, "block_events": n}
    tree_events = None
    if llm is not None:
        translated = radix_events(payloads, llm.compute_block_hash_for_seq)
        tree_events = translated.events
        row |= {"rerooted": translated.rerooted, "dropped": translated.removes_dropped}
    decode, ingest, tree, errors = [], [], [], 0
    for _ in range(runs):
        decode.append(n / time_decode_only(payloads))
        ingest.append(n / time_ingest(payloads))
        if llm is not None and tree_events is not None:
            run = time_radix_tree(llm, tree_events)
            tree.append(n / run.seconds)
            errors += run.errors
    row |= {"decode": statistics.median(decode), "ingest": statistics.median(ingest)}
    if tree:
        row |= {"tree": statistics.median(tree), "tree_errors": errors}
    return row


def print_row(row: dict[str, float | int | str]) -> None:
    decode, ingest = float(row["decode"]), float(row["ingest"])
    line = (
        f"{row['workload']:<10} {row['block_events']:>12,} {decode:>14,.0f} {ingest:>12,.0f}"
        f" {ingest / decode:>6.2f}"
    )
    if "tree" in row:
        tree = float(row["tree"])
        line += f" {tree:>12,.0f} {ingest / tree:>10.2f}"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--cpu", type=int, default=min(os.sched_getaffinity(0)),
        help="the core everything runs on (the tree's thread too); -1: not pinned",
    )  # fmt: skip
    args = parser.parse_args()
    pinned = pin_to_one_core(None if args.cpu < 0 else args.cpu)
    llm = dynamo_llm()
    print(f"{pinned}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if llm is None:
        print(missing_line("Dynamo's RadixTree"))
    else:
        print(f"peer: {peer_version()}, RadixTree.apply_event (JSON KvCacheEvent per event)")
    header = f"{'workload':<10} {'block-events':>12} {'decode-only/s':>14} {'ingest/s':>12}"
    header += f" {'ratio':>6}"
    if llm is not None:
        header += f" {'RadixTree/s':>12} {'kvsi/tree':>10}"
    print(header)
    rows = []
    for name, make in (("small", small_events), ("agentic", agentic)):
        row = measure(name, make(args.batches, args.seed), args.runs, llm)
        print_row(row)
        rows.append(row)
    print(f"(medians of {args.runs} runs; ratio = ingest rate / decode-only rate, same payloads)")
    for row in rows:
        if "tree" in row:
            print(
                f"{row['workload']}: stores re-rooted for the tree {row['rerooted']:,}, "
                f"removed hashes it never held {row['dropped']:,}, "
                f"events it rejected {row['tree_errors']:,}"
            )
    if llm is not None:
        print("target (issue 18): kvsi/tree >= 2.0 on both workloads")


if __name__ == "__main__":
    main()
