"""How many block-events/s does `kvsi serve` keep up with over ZMQ, against Dynamo's standalone
indexer (`python -m dynamo.indexer`) on the same publishers?

Run: `.venv/peers/bin/python bench/ingest_e2e.py` (see bench/README.md). This process runs
`--pods` simulated vLLM 0.33 publishers on loopback; each indexer in turn (a process of its
own, fresh publishers each time) subscribes to them, then every publisher sends its
prebuilt batches at full speed, and the time until the indexer has applied them all gives
the rate it kept up with. Without ai-dynamo-runtime (the `peers` extra) it says so and
measures kvsi alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import httpx
import msgspec
from ingest_memory import agentic, small_events
from peers import dynamo_llm, missing_line, peer_version
from processes import background

from kvsi.logs import configure_logging
from kvsi.simulator.fleet import pod_names
from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.subscriber import wire

REPO = Path(__file__).resolve().parent.parent
BLOCK_SIZE = 16
MODEL = "bench"
START_SECONDS = 60.0
"""Longest wait for an indexer to answer HTTP and receive every publisher's warm-up."""
WARMUP_ROUND_SECONDS = 0.5
"""A warm-up round: one store per publisher, then this long for the indexer to show it."""
POLL_SECONDS = 0.05
"""How often the indexer's applied count is read while it drains (the end time's grain)."""
STALL_SECONDS = 10.0
"""An indexer whose applied count stays put this long has lost events: the run stops."""
WARMUP_TS = time.time()
"""Warm-up batches are stamped from here on; the measured ones after (`stamped`)."""
WARMUP_HASH = 1 << 62
"""Block hashes of warm-up stores start here (the workloads' random ones never collide in
practice, and are not looked up anyway)."""


@dataclass(frozen=True, slots=True)
class Totals:
    """What the measured phase publishes, in each indexer's unit."""

    block_events: int
    events: int


def totals(payloads: Sequence[Sequence[bytes]]) -> Totals:
    decoder = msgspec.msgpack.Decoder(wire.KVEventBatch)
    block_events = events = 0
    for stream in payloads:
        for payload in stream:
            for event in decoder.decode(payload).events:
                events += 1
                if not isinstance(event, wire.AllBlocksCleared):
                    block_events += len(event.block_hashes)
    return Totals(block_events, events)


def stamped(payloads: Sequence[bytes], start: float) -> list[bytes]:
    """The batches stamped from `start` on, a millisecond apart: an indexer that follows
    engine restarts by time (kvsi) must see them newer than the warm-up."""
    decoder = msgspec.msgpack.Decoder(wire.KVEventBatch)
    encoder = msgspec.msgpack.Encoder()
    out = []
    for b, payload in enumerate(payloads):
        batch = decoder.decode(payload)
        batch.ts = start + b / 1000
        out.append(encoder.encode(batch))
    return out


def warmup_store(round_: int, pod: int) -> wire.BlockStored:
    """A one-block store from the root; tokens shared by every pod in a round, so one lookup
    of its tokens hash tells which workers have it."""
    return wire.BlockStored(
        block_hashes=[WARMUP_HASH + round_ * 1024 + pod],
        parent_block_hash=None,
        token_ids=[100_000 + round_ * BLOCK_SIZE + i for i in range(BLOCK_SIZE)],
        block_size=BLOCK_SIZE,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        session_id=f"warmup-{round_}",
    )


def metric_sum(text: str, name: str, label: str = "") -> float:
    """The sum of a metric's samples in Prometheus text (0 if absent); with `label` (as
    written, e.g. `le="0.02"`), of those samples that carry it."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{([^}}]*)}})? ([0-9.e+-]+)$", re.M)
    return sum(float(v) for labels, v in pattern.findall(text) if label in labels)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cpu_seconds(pid: int) -> float:
    """User plus system CPU of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Indexer(Protocol):
    """One indexer under test: how to start it and read how far it got."""

    name: str
    unit: str

    def command(self, pubs: Sequence[SimulatedPublisher], port: int) -> list[str]: ...

    def env(self, pubs: Sequence[SimulatedPublisher]) -> dict[str, str]: ...

    async def has_round(self, client: httpx.AsyncClient, round_: int, pods: int) -> bool: ...

    async def applied(self, client: httpx.AsyncClient) -> float: ...

    async def notes(self, client: httpx.AsyncClient) -> str: ...

    def expected(self, totals: Totals) -> int: ...


class Kvsi:
    """`kvsi serve` with the memory store, everything else at its defaults."""

    name = "kvsi serve"
    unit = "block-events"

    def command(self, pubs: Sequence[SimulatedPublisher], port: int) -> list[str]:
        return [sys.executable, "-m", "kvsi", "serve", "--port", str(port), "--store", "memory"]

    def env(self, pubs: Sequence[SimulatedPublisher]) -> dict[str, str]:
        publishers = [
            {"pod": pod, "endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint}
            for pod, p in zip(pod_names(len(pubs)), pubs, strict=True)
        ]
        return {"KVSI_PUBLISHERS": json.dumps(publishers), "PYTHONPATH": str(REPO)}

    async def has_round(self, client: httpx.AsyncClient, round_: int, pods: int) -> bool:
        """Every pod live with the warm-up round's batch (seq `round_`) applied."""
        workers = (await client.get("/v1/pods")).json()["pods"]
        done = [w for w in workers if w["state"] == "live" and (w["last_seq"] or 0) >= round_]
        return len(done) == pods and all(w["last_seq"] is not None for w in done)

    async def applied(self, client: httpx.AsyncClient) -> float:
        return metric_sum((await client.get("/metrics")).text, "kvsi_fleet_block_events_total")

    async def notes(self, client: httpx.AsyncClient) -> str:
        text = (await client.get("/metrics")).text
        names = ("batches_lost", "queue_overflow", "batches_replayed", "seq_gaps")
        return ", ".join(
            f"{n.replace('_', ' ')} {metric_sum(text, f'kvsi_fleet_{n}_total'):.0f}" for n in names
        )

    def expected(self, totals: Totals) -> int:
        return totals.block_events


class Dynamo:
    """`python -m dynamo.indexer` with the publishers as its initial workers 1..N."""

    name = "dynamo.indexer"
    unit = "events"

    def __init__(self, llm: ModuleType, threads: int | None) -> None:
        self._local_hash: Callable[[list[int], int], list[int]] = llm.compute_block_hash_for_seq
        self._threads = threads

    def command(self, pubs: Sequence[SimulatedPublisher], port: int) -> list[str]:
        workers = ",".join(f"{i}={p.endpoint}" for i, p in enumerate(pubs, 1))
        argv = [sys.executable, "-m", "dynamo.indexer", "--port", str(port)]
        argv += ["--block-size", str(BLOCK_SIZE), "--model-name", MODEL, "--workers", workers]
        if self._threads is not None:
            argv += ["--threads", str(self._threads)]
        return argv

    def env(self, pubs: Sequence[SimulatedPublisher]) -> dict[str, str]:
        return {}

    async def has_round(self, client: httpx.AsyncClient, round_: int, pods: int) -> bool:
        """Every worker holds the round's block (one lookup of its tokens hash)."""
        (local,) = self._local_hash(list(warmup_store(round_, 0).token_ids), BLOCK_SIZE)
        signed = local - (1 << 64) if local >= 1 << 63 else local
        answer = await client.post(
            "/query_by_hash", json={"block_hashes": [signed], "model_name": MODEL}
        )
        return len(answer.json().get("scores", {})) == pods

    async def applied(self, client: httpx.AsyncClient) -> float:
        text = (await client.get("/metrics")).text
        return metric_sum(text, "dynamo_kvrouter_kv_cache_events_applied")

    async def notes(self, client: httpx.AsyncClient) -> str:
        text = (await client.get("/metrics")).text
        pattern = (
            r'^dynamo_kvrouter_kv_cache_events_applied{event_type="(\w+)",status="(\w+)"} (\S+)$'
        )
        bad = [
            f"{kind} {status} {float(n):.0f}"
            for kind, status, n in re.findall(pattern, text, re.M)
            if status != "ok" and float(n)
        ]
        return "events not applied: " + (", ".join(bad) if bad else "none")

    def expected(self, totals: Totals) -> int:
        return totals.events


@dataclass(slots=True)
class Result:
    indexer: str
    seconds: float
    publish_seconds: float
    complete: bool
    cpu: float
    notes: str


@contextlib.asynccontextmanager
async def publishers(pods: int, batches: int) -> AsyncIterator[list[SimulatedPublisher]]:
    """Fresh publishers (seqs from 0), each able to replay the whole run."""
    pubs = [
        SimulatedPublisher(
            "tcp://127.0.0.1:*",
            replay_endpoint="tcp://127.0.0.1:*",
            pod=pod,
            buffer_steps=batches + 1000,
            hwm=batches + 1000,
        )
        for pod in pod_names(pods)
    ]
    try:
        for pub in pubs:
            await pub.start()
        yield pubs
    finally:
        for pub in pubs:
            await pub.close()


@contextlib.contextmanager
def process(argv: list[str], env: dict[str, str]) -> Any:
    """The indexer in a session of its own, its output in a file; stopped after."""
    with background(argv, env, "ingest-e2e-") as running:
        yield running


async def warm_up(
    indexer: Indexer, client: httpx.AsyncClient, pubs: Sequence[SimulatedPublisher]
) -> None:
    """Rounds of one store per publisher until the indexer shows a round on every worker:
    its subscriptions are connected (a PUB drops what it sends before that)."""
    deadline = time.monotonic() + START_SECONDS
    round_ = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            await client.get("/metrics")
            for pod, pub in enumerate(pubs):
                await pub.publish([warmup_store(round_, pod)], ts=WARMUP_TS + round_ / 1000)
            until = time.monotonic() + WARMUP_ROUND_SECONDS
            while time.monotonic() < until:
                if await indexer.has_round(client, round_, len(pubs)):
                    return
                await asyncio.sleep(0.05)
            round_ += 1
            continue
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{indexer.name} did not receive every publisher's warm-up")


async def blast(pubs: Sequence[SimulatedPublisher], payloads: Sequence[Sequence[bytes]]) -> None:
    """Every publisher's batches at full speed, round robin."""
    for b in range(len(payloads[0])):
        for pub, stream in zip(pubs, payloads, strict=True):
            await pub.publish_payload(stream[b])


async def drained(indexer: Indexer, client: httpx.AsyncClient, target: float) -> bool:
    """Poll until the applied count reaches `target`; False if it stalls short of it."""
    last, last_change = -1.0, time.monotonic()
    while True:
        now = await indexer.applied(client)
        if now >= target:
            return True
        if now != last:
            last, last_change = now, time.monotonic()
        elif time.monotonic() - last_change > STALL_SECONDS:
            return False
        await asyncio.sleep(POLL_SECONDS)


@contextlib.asynccontextmanager
async def serving(
    indexer: Indexer, pubs: Sequence[SimulatedPublisher]
) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    """The indexer's process, subscribed to `pubs` and warmed up, and a client of its HTTP
    port; its log's end printed if the warm-up fails."""
    port = free_port()
    with process(indexer.command(pubs, port), indexer.env(pubs)) as (proc, log):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as c:
            try:
                await warm_up(indexer, c, pubs)
            except TimeoutError:
                print(log.read_text()[-3000:], file=sys.stderr)
                raise
            yield proc, c


async def run_one(indexer: Indexer, payloads: Sequence[Sequence[bytes]], total: Totals) -> Result:
    async with (
        publishers(len(payloads), len(payloads[0])) as pubs,
        serving(indexer, pubs) as (proc, c),
    ):
        base = await indexer.applied(c)
        cpu = cpu_seconds(proc.pid)
        started = time.monotonic()
        await blast(pubs, payloads)
        published = time.monotonic()
        complete = await drained(indexer, c, base + indexer.expected(total))
        seconds = time.monotonic() - started
        cpu = cpu_seconds(proc.pid) - cpu
        notes = await indexer.notes(c)
        if not complete:
            got = await indexer.applied(c) - base
            notes += f"; INCOMPLETE: {got:,.0f} of {indexer.expected(total):,} {indexer.unit}"
    return Result(indexer.name, seconds, published - started, complete, cpu / seconds, notes)


WORKLOADS: dict[str, Callable[[int, int], list[bytes]]] = {
    "small": lambda batches, seed: small_events(batches, seed, rooted=True),
    "agentic": agentic,
}


async def main_async(args: argparse.Namespace) -> None:
    configure_logging("warning", "console")
    llm = dynamo_llm()
    indexers: list[Indexer] = [Kvsi()]
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if llm is None:
        print(missing_line("Dynamo's standalone indexer"))
    else:
        indexers.append(Dynamo(llm, args.dynamo_threads))
        threads = args.dynamo_threads or "its default"
        print(f"peer: {peer_version()}, python -m dynamo.indexer --threads {threads}")
    for workload in args.workload.split(","):
        make = WORKLOADS[workload]
        start = time.time()
        payloads = [stamped(make(args.batches, args.seed + pod), start) for pod in range(args.pods)]
        total = totals(payloads)
        print(
            f"{workload}: {args.pods} pods x {args.batches:,} batches, "
            f"{total.block_events:,} block-events in {total.events:,} events"
        )
        rates: dict[str, list[float]] = {}
        per_core: dict[str, list[float]] = {}
        for n in range(args.runs):
            order = indexers if n % 2 == 0 else indexers[::-1]
            for indexer in order:
                result = await run_one(indexer, payloads, total)
                rate = total.block_events / result.seconds
                publish = total.block_events / result.publish_seconds
                if result.complete:
                    rates.setdefault(indexer.name, []).append(rate)
                    per_core.setdefault(indexer.name, []).append(rate / result.cpu)
                print(
                    f"  run {n + 1} {indexer.name:<15} {rate:>10,.0f} block-events/s "
                    f"(published at {publish:>10,.0f}/s) in {result.seconds:.2f} s, "
                    f"{result.cpu:.2f} cores; {result.notes}",
                    flush=True,
                )
        medians = {name: statistics.median(r) for name, r in rates.items()}
        for name, rate in medians.items():
            core = statistics.median(per_core[name])
            print(
                f"{workload} {name:<15} median {rate:>10,.0f} block-events/s, "
                f"{core:>10,.0f} per core"
            )
        if len(medians) == 2:
            ratio = medians[Kvsi.name] / medians[Dynamo.name]
            print(f"{workload} kvsi / dynamo.indexer: {ratio:.2f} (target, issue 18: >= 1.0)")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--batches", type=int, default=4000, help="per pod")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workload", default="small", help="small, agentic or both: small,agentic")
    parser.add_argument("--dynamo-threads", type=int, default=None)
    args = parser.parse_args()
    unknown = set(args.workload.split(",")) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workload {', '.join(sorted(unknown))}; valid: small, agentic")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
