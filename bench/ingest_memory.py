"""How fast does ingest (decode + apply) run into the memory store, against decode alone?

Run: `.venv/bin/python bench/ingest_memory.py` (see bench/README.md). Prints medians of
several runs and the ratio ingest/decode-only, measured in the same run on the same payloads.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import msgspec

from simulator.engine import SimulatedEngine
from simulator.workload import AgenticWorkload
from store.memory import MemoryStore
from store.model import Batch, WorkerKey
from subscriber import wire
from subscriber.decode import ingest_decoder

ENCODER = msgspec.msgpack.Encoder()


def _encode(events: list[wire.KVCacheEvent], ts: float) -> bytes:
    return ENCODER.encode(wire.KVEventBatch(ts=ts, events=events, data_parallel_rank=0))


def small_events(batches: int, seed: int) -> list[bytes]:
    """DESIGN.md's shape: 16 stores of 4 blocks per batch, evictions at 50k resident."""
    rng = random.Random(seed)
    sessions = [f"sess-{i}" for i in range(2000)]
    resident: list[int] = []
    out = []
    for b in range(batches):
        events: list[wire.KVCacheEvent] = []
        for _ in range(16):
            hashes = [rng.getrandbits(64) for _ in range(4)]
            resident.extend(hashes)
            events.append(
                wire.BlockStored(
                    block_hashes=list(hashes),
                    parent_block_hash=rng.getrandbits(64),
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


def agentic(batches: int, seed: int) -> list[bytes]:
    """The simulator's agent traffic: shared system prompts, growing turns, reuse reports."""
    engine = SimulatedEngine(num_blocks=50_000, seed=seed)
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


def median_rate(
    fn: Callable[[list[bytes]], float], payloads: list[bytes], n: int, runs: int
) -> float:
    return statistics.median(n / fn(payloads) for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print(
        f"{'workload':<10} {'block-events':>12} {'decode-only/s':>14} {'ingest/s':>12} {'ratio':>6}"
    )
    for name, make in (("small", small_events), ("agentic", agentic)):
        payloads = make(args.batches, args.seed)
        n = block_events(payloads)
        decode = median_rate(time_decode_only, payloads, n, args.runs)
        ingest = median_rate(time_ingest, payloads, n, args.runs)
        print(f"{name:<10} {n:>12,} {decode:>14,.0f} {ingest:>12,.0f} {ingest / decode:>6.2f}")
    print(f"(medians of {args.runs} runs; ratio = ingest rate / decode-only rate, same payloads)")


if __name__ == "__main__":
    main()
