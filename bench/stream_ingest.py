"""How fast do WorkerStreams take a backlog in one process: receive, order, decode, apply?

Run: `.venv/bin/python bench/stream_ingest.py` (see bench/README.md). The per-message path of
subscriber/stream.py without the operating system's noise around `ingest_e2e.py`: publishers
and streams share one event loop and one ZMQ context over `inproc://`, into the memory store.
Prints block-events/s per run (wall time) and per CPU second of this process (steadier on a
shared machine), and the medians per workload.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from typing import Any

import msgspec
import structlog
import zmq
import zmq.asyncio
from ingest_memory import agentic, small_events

from kvsi.store.memory import MemoryStore
from kvsi.store.model import WorkerKey
from kvsi.subscriber import wire
from kvsi.subscriber.gate import StoreGate
from kvsi.subscriber.stream import IngestOptions, PublisherSpec, WorkerStream

TOPIC = b"kv@bench@model"
DECODER = msgspec.msgpack.Decoder(wire.KVEventBatch)


def block_events(payloads: list[bytes]) -> int:
    total = 0
    for payload in payloads:
        for event in DECODER.decode(payload).events:
            if isinstance(event, wire.BlockStored | wire.BlockRemoved):
                total += len(event.block_hashes)
    return total


def frames(seq: int, payload: bytes) -> list[bytes]:
    return [TOPIC, seq.to_bytes(8, "big"), payload]


async def one_run(run: int, workload: list[list[bytes]]) -> tuple[float, float]:
    """Wall and CPU seconds from the first send of the backlog (seq 1 on) to every batch
    applied (the process's CPU time: what the path costs, whatever else the machine runs)."""
    ctx = zmq.asyncio.Context()
    store = MemoryStore()
    gate = StoreGate(store)
    options = IngestOptions(queue_size=len(workload[0]) + 10, index_audit=3600.0)
    pubs, streams, tasks = [], [], []
    try:
        for pod, _ in enumerate(workload):
            pub = ctx.socket(zmq.PUB)
            pub.setsockopt(zmq.SNDHWM, 0)
            endpoint = f"inproc://bench-{run}-{pod}"
            pub.bind(endpoint)
            pubs.append(pub)
            stream = WorkerStream(PublisherSpec(f"pod-{pod}", endpoint), gate, ctx, options=options)
            streams.append(stream)
            tasks.append(asyncio.create_task(stream.run()))
        for pod, (pub, payloads) in enumerate(zip(pubs, workload, strict=True)):
            # Seq 0 until it is applied: the subscription is connected (a PUB drops before).
            while await store.fence(WorkerKey(f"pod-{pod}", 0)) is None:
                await pub.send_multipart(frames(0, payloads[0]))
                await asyncio.sleep(0.01)
        last = len(workload[0]) - 1
        began = time.perf_counter()
        cpu = time.process_time()
        for seq in range(1, last + 1):
            for pub, payloads in zip(pubs, workload, strict=True):
                await pub.send_multipart(frames(seq, payloads[seq]))
            if seq % 64 == 0:
                await asyncio.sleep(0)
        while True:
            fences = [await store.fence(WorkerKey(f"pod-{pod}", 0)) for pod in range(len(pubs))]
            if all(fence is not None and fence.seq == last for fence in fences):
                break
            await asyncio.sleep(0.002)
        seconds = time.perf_counter() - began
        cpu = time.process_time() - cpu
        assert all(s.counters.batches_lost == 0 for s in streams)
        return seconds, cpu
    finally:
        await close_all(tasks, pubs, ctx)


async def close_all(
    tasks: list[asyncio.Task[None]], pubs: list[zmq.Socket[bytes]], ctx: zmq.Context[Any]
) -> None:
    """Stop the streams' tasks, then close the publishers and the context."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for pub in pubs:
        pub.close(linger=0)
    ctx.destroy(linger=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--batches", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workload", default="small,agentic")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    makers = {"small": small_events, "agentic": agentic}
    for name in args.workload.split(","):
        workload = [makers[name](args.batches, args.seed + pod) for pod in range(args.pods)]
        events = sum(block_events(payloads[1:]) for payloads in workload)
        print(f"{name}: {args.pods} streams x {args.batches:,} batches, {events:,} block-events")
        rates, per_cpu = [], []
        for run in range(args.runs):
            seconds, cpu = asyncio.run(one_run(run, workload))
            rates.append(events / seconds)
            per_cpu.append(events / cpu)
            print(
                f"  run {run + 1}: {rates[-1]:>12,.0f} block-events/s in {seconds:.2f} s, "
                f"{per_cpu[-1]:>12,.0f} per CPU second"
            )
        print(
            f"{name} median {statistics.median(rates):>12,.0f} block-events/s, "
            f"{statistics.median(per_cpu):>12,.0f} per CPU second"
        )


if __name__ == "__main__":
    main()
