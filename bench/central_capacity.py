"""How many workers does one central ingest process carry at an agentic rate per worker?

Run: `.venv/bin/python bench/central_capacity.py [--store memory,redis] [--workers 25,50,100]
[--rate 20] [--seconds 20]` (see bench/README.md). This process runs N simulated vLLM 0.33
publishers on loopback; one `kvsi serve` (the memory store, or a fresh redis-server of the
bench's own) subscribes to all of them, as a central replica does to its share. After a
warm-up (every worker live), every publisher sends `--rate` batches a second for
`--seconds`, each batch the simulator's agent traffic (`ingest_memory.agentic`: four agent
turns of sessions sharing system prompts, with reuse reports, on an engine of
`ENGINE_BLOCKS` blocks that evicts once full). The bench reads
kvsi's applied block-events every half second: a process that keeps up applies in the
second half of the phase what was sent meanwhile and ends it with under a second of
backlog; one that falls behind ends with a backlog that grew through the phase.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio
from ingest_e2e import (
    WARMUP_TS,
    Kvsi,
    cpu_seconds,
    publishers,
    serving,
    stamped,
)
from ingest_memory import agentic, block_events
from ingest_redis import redis_server

from kvsi.logs import configure_logging
from kvsi.simulator.publisher import SimulatedPublisher

STREAMS = 8
"""Distinct payload streams; worker i sends stream i % STREAMS (the index keeps each worker
apart, so equal payloads on two workers cost what different ones would)."""

ENGINE_BLOCKS = 4_096
"""Blocks of each simulated engine: full within the phase's first hundred-odd batches, so
most of the phase evicts as a busy engine does (a 50,000-block engine would not evict for
the whole phase, and removals are half of a busy engine's block-events)."""

POLL_SECONDS = 0.5
DRAIN_SECONDS = 60.0
"""Longest wait after the phase for the backlog to be applied."""

KEEPS_UP = 0.95
"""Applied / sent over the phase's second half at or above which the process keeps up (and
its backlog at the end must be under a second of the offered load)."""


def block_events_of(payload: bytes) -> int:
    return block_events([payload])


class KvsiOn(Kvsi):
    """`kvsi serve` on the given store URL, at its defaults otherwise."""

    def __init__(self, store: str) -> None:
        self.store = store
        self.name = f"kvsi serve ({store.split('://')[0]})"

    def command(self, pubs: Sequence[SimulatedPublisher], port: int) -> list[str]:
        argv = [sys.executable, "-m", "kvsi", "serve", "--port", str(port)]
        return [*argv, "--store", self.store]

    def env(self, pubs: Sequence[SimulatedPublisher]) -> dict[str, str]:
        return super().env(pubs) | {"KVSI_MAX_WORKERS": str(max(1024, len(pubs)))}


@dataclass(slots=True)
class Progress:
    """What the publishers sent so far (block-events), read by the poller."""

    sent: int = 0


async def paced(
    pubs: Sequence[SimulatedPublisher],
    streams: Sequence[Sequence[bytes]],
    sizes: Sequence[Sequence[int]],
    rate: float,
    ticks: int,
    progress: Progress,
) -> float:
    """`ticks` rounds, `rate` a second: each publisher sends its stream's next batch.
    Returns the seconds it took (more than ticks / rate if the publishers fell behind)."""
    began = time.monotonic()
    for tick in range(ticks):
        delay = began + tick / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        for i, pub in enumerate(pubs):
            await pub.publish_payload(streams[i % STREAMS][tick])
            progress.sent += sizes[i % STREAMS][tick]
    return time.monotonic() - began


async def one_run(
    indexer: KvsiOn, workers: int, streams: Sequence[Sequence[bytes]], rate: float, ticks: int
) -> dict[str, Any]:
    sizes = [[block_events_of(p) for p in stream] for stream in streams]
    async with publishers(workers, ticks) as pubs, serving(indexer, pubs) as (proc, c):
        base = await indexer.applied(c)
        cpu = cpu_seconds(proc.pid)
        progress = Progress()
        samples: list[tuple[float, int, float]] = []
        sender = asyncio.create_task(paced(pubs, streams, sizes, rate, ticks, progress))
        began = time.monotonic()
        while not sender.done():
            await asyncio.sleep(POLL_SECONDS)
            applied = await indexer.applied(c) - base
            samples.append((time.monotonic() - began, progress.sent, applied))
        send_seconds = await sender
        cpu = (cpu_seconds(proc.pid) - cpu) / (time.monotonic() - began)
        end_sent, end_applied = progress.sent, samples[-1][2]
        drain_began = time.monotonic()
        while await indexer.applied(c) - base < end_sent:
            if time.monotonic() - drain_began > DRAIN_SECONDS:
                break
            await asyncio.sleep(0.1)
        drain = time.monotonic() - drain_began
        notes = await indexer.notes(c)
    # From the last sample of the first half (the start if none: a saturated process may
    # answer /metrics only every few seconds) to the last one.
    (t1, sent1, applied1) = samples[-1]
    first_half = [s for s in samples[:-1] if s[0] <= t1 / 2]
    (t0, sent0, applied0) = first_half[-1] if first_half else (0.0, 0, 0.0)
    offered = end_sent / send_seconds
    ratio = (applied1 - applied0) / max(1, sent1 - sent0)
    backlog = (end_sent - end_applied) / offered
    return {
        "workers": workers,
        "offered": offered,
        "applied_second_half": (applied1 - applied0) / (t1 - t0),
        "ratio": ratio,
        "backlog_s": backlog,
        "drain_s": drain,
        "send_s": send_seconds,
        "cores": cpu,
        "keeps_up": ratio >= KEEPS_UP and backlog < 1.0,
        "notes": notes,
    }


def show(store: str, r: dict[str, Any]) -> None:
    print(
        f"{store} | {r['workers']} | {r['offered']:,.0f} | {r['applied_second_half']:,.0f} | "
        f"{r['ratio']:.2f} | {r['backlog_s']:.1f} | {r['drain_s']:.1f} | {r['send_s']:.1f} | "
        f"{r['cores']:.2f} | {'yes' if r['keeps_up'] else 'NO'} | {r['notes']}",
        flush=True,
    )


async def run_store(store: str, args: argparse.Namespace, streams: list[list[bytes]]) -> None:
    ticks = int(args.rate * args.seconds)
    for workers in (int(n) for n in args.workers.split(",")):
        if store == "memory":
            result = await one_run(KvsiOn("memory"), workers, streams, args.rate, ticks)
        else:
            with redis_server(512) as port:
                url = f"redis://127.0.0.1:{port}/0"
                result = await one_run(KvsiOn(url), workers, streams, args.rate, ticks)
        show(store, result)
        if not result["keeps_up"] and not args.past:
            return


async def main(args: argparse.Namespace) -> None:
    configure_logging("warning", "console")
    # The publishers share the default context: a PUB and a ROUTER per worker, and more
    # than its default 1,023 sockets for 500 workers and up.
    most = max(int(n) for n in args.workers.split(","))
    zmq.asyncio.Context.instance().set(zmq.MAX_SOCKETS, 4 * most + 64)
    ticks = int(args.rate * args.seconds)
    traffic = [agentic(ticks, seed, ENGINE_BLOCKS) for seed in range(STREAMS)]
    streams = [stamped(stream, WARMUP_TS + 100) for stream in traffic]
    per_batch = statistics.mean(block_events_of(p) for s in streams for p in s)
    print(
        f"load average at start {os.getloadavg()[0]:.2f}; per worker {args.rate:g} batches/s "
        f"x {per_batch:.1f} block-events = {args.rate * per_batch:,.0f} block-events/s"
    )
    print(
        "store | workers | offered block-events/s | applied/s (2nd half) | applied/sent | "
        "backlog at end s | drain s | send s | cores | keeps up | notes"
    )
    for store in args.store.split(","):
        await run_store(store, args, streams)
    print(f"load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="memory,redis", help="memory, redis or both")
    parser.add_argument("--workers", default="25,50,100,200,400", help="counts, rising")
    parser.add_argument("--rate", type=float, default=20.0, help="batches/s per worker")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the phase")
    parser.add_argument("--past", action="store_true", help="go on past the first NO")
    asyncio.run(main(parser.parse_args()))
