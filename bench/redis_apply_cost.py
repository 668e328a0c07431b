"""What one apply costs Redis and the ingest process, by the batch's shape: a cost per call,
per block-event that changes the index, per block-event that re-announces an entry; and
what paced applies cost against the same ones back to back.

Run: `.venv/bin/python bench/redis_apply_cost.py [--redis standalone|cluster]` (see
bench/README.md). Starts its own redis-server or 3-master cluster on free loopback ports (no
persistence), prints every figure, stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from dataclasses import dataclass

import msgspec
import redis
from fleet_latency import servers
from ingest_memory import agentic
from route_latency import stored

from kvsi.store.model import ApplyOutcome, Batch, WorkerKey
from kvsi.store.redis import RedisStore
from kvsi.subscriber import wire
from kvsi.subscriber.decode import ingest_decoder

INTSET_ENTRIES = 4096
"""The servers' `set-max-intset-entries`, as deploy/README.md recommends."""
BLOCKS_PER_STORE = 4
BLOCKS_PER_SESSION = 10
PREFILL_PER_BATCH = 64
STEADY_SESSIONS = 100
STEADY_BLOCKS = 1_000
"""Steady blocks kept before each store evicts as many (route_latency.py's shape)."""
PACED_STORES = 8
"""The paced batches' stores: route_latency.py's steady batch (and fleet_latency.py's)."""
IDLE_SECONDS = 5.0
TOKENS = list(range(BLOCKS_PER_STORE * 16))
ENCODER = msgspec.msgpack.Encoder()


class Engine:
    """One worker's batches: a prefill of 10-block prompts, then steady stores continuing
    sessions' chains (new blocks), evictions of the oldest steady blocks, and re-announced
    stores (a session's last blocks again: entries it already holds)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.seq = 0
        self.ts = 1_000.0
        self.tails: dict[str, tuple[int | None, list[int]]] = {}
        """Each steady session's last store: its parent and its blocks."""
        self.live: list[int] = []

    def _batch(self, events: list[wire.KVCacheEvent]) -> bytes:
        self.seq += 1
        self.ts += 0.001
        return ENCODER.encode(wire.KVEventBatch(ts=self.ts, events=events, data_parallel_rank=0))

    def prefill(self, sessions: int) -> list[bytes]:
        out = []
        for start in range(0, sessions, PREFILL_PER_BATCH):
            events: list[wire.KVCacheEvent] = []
            for s in range(start, min(sessions, start + PREFILL_PER_BATCH)):
                hashes = [self.rng.getrandbits(64) for _ in range(BLOCKS_PER_SESSION)]
                events.append(stored(hashes, f"sess-{s}", TOKENS))
            out.append(self._batch(events))
        return out

    def steady(self, stores: int, reused: int) -> bytes:
        """`stores` stores of new blocks (and as many evicted, once the steady blocks are
        full) and `reused` stores re-announcing a session's last blocks."""
        events: list[wire.KVCacheEvent] = []
        for _ in range(stores):
            session = f"load-{self.rng.randrange(STEADY_SESSIONS)}"
            fresh = [self.rng.getrandbits(64) for _ in range(BLOCKS_PER_STORE)]
            last = self.tails.get(session)
            parent = last[1][-1] if last else None
            events.append(stored(fresh, session, TOKENS, parent))
            self.tails[session] = (parent, fresh)
            self.live.extend(fresh)
        while len(self.live) > STEADY_BLOCKS:
            old, self.live[:] = self.live[:BLOCKS_PER_STORE], self.live[BLOCKS_PER_STORE:]
            events.append(wire.BlockRemoved(block_hashes=list[bytes | int](old), medium="GPU"))
        resident = set(self.live)
        held = [s for s, (_, tail) in self.tails.items() if resident.issuperset(tail)]
        for _ in range(reused):
            session = self.rng.choice(held)
            parent, blocks = self.tails[session]
            events.append(stored(list(blocks), session, TOKENS, parent))
        return self._batch(events)


@dataclass(frozen=True)
class Cost:
    stores: int
    reused: int
    block_events: float
    redis_us: float
    client_us: float
    calls_per_second: float
    """Applies per second of wall time: one ingest process's rate (its share of each shard:
    this over the shards)."""


async def measure(
    store: RedisStore,
    ports: list[int],
    engines: list[Engine],
    stores: int,
    reused: int,
    batches: int,
    pace: Pace | None = None,
) -> Cost:
    """`batches` steady batches of one shape per worker, one `apply` each, round robin over
    the workers (as a server shared by a fleet sees them), back to back or `pace`d."""
    work = []
    for _ in range(batches):
        for w, engine in enumerate(engines):
            payload = engine.steady(stores, reused)
            work.append((WorkerKey(f"pod-{w}", 0), engine.seq, payload))
    return await applied(store, ports, work, (stores, reused), pace)


@dataclass(frozen=True)
class PacedScale:
    shards: int
    idle_cores: float


@dataclass(frozen=True)
class Pace:
    """Applies `gap` seconds apart, as a lightly loaded fleet sends them; the servers' own
    CPU at rest (`idle_cores`, their timers) is taken out of what they are charged."""

    gap: float
    idle_cores: float


async def applied(
    store: RedisStore,
    ports: list[int],
    work: list[tuple[WorkerKey, int, bytes]],
    shape: tuple[int, int] = (0, 0),
    pace: Pace | None = None,
) -> Cost:
    """Decode and apply every (worker, seq, payload), one `apply` each; their cost. The
    store is the one that wrote the workers before: its writers' mirrors are loaded."""
    decoder = ingest_decoder()
    events = sum(block_events(payload) for _, _, payload in work)
    server0 = server_cpu(ports)
    cpu0 = time.process_time()
    wall0 = time.monotonic()
    outcomes = []
    for worker, seq, payload in work:
        decoded = decoder.decode(payload)
        outcomes.append(await store.apply(worker, Batch(seq, decoded.ts, decoded.events)))
        if pace is not None:
            await asyncio.sleep(pace.gap)
    client = time.process_time() - cpu0
    wall = time.monotonic() - wall0
    server = server_cpu(ports) - server0
    if pace is not None:
        server -= pace.idle_cores * wall
    odd = [o for o in outcomes if o is not ApplyOutcome.APPLIED]
    if odd:
        raise RuntimeError(f"{len(odd)} of {len(outcomes)} batches not applied: {odd[0]}")
    n = len(work)
    return Cost(*shape, events / n, server / n * 1e6, client / n * 1e6, n / wall)


class Entries:
    """A worker's (session, block) entries, to tell a store's block-events that change the
    index (a new entry, an evicted block) from those re-announcing an entry. Keyed by block
    alone: the workloads measured here store one medium and group. A removal of a block no
    session holds counts as neither (the agentic workload has none)."""

    def __init__(self) -> None:
        self.sessions: dict[bytes | int, set[str]] = {}

    def count(self, payload: bytes) -> tuple[int, int]:
        """(changing, re-announced) block-events of one batch, applied to the entries."""
        changing = reannounced = 0
        for event in msgspec.msgpack.decode(payload, type=wire.KVEventBatch).events:
            if isinstance(event, wire.BlockStored):
                session = event.session_id or ""
                for block in event.block_hashes:
                    holders = self.sessions.setdefault(block, set())
                    if session in holders:
                        reannounced += 1
                    else:
                        holders.add(session)
                        changing += 1
            elif isinstance(event, wire.BlockRemoved):
                for block in event.block_hashes:
                    changing += self.sessions.pop(block, None) is not None
            else:  # a clear: no block-event (`block_events`), the entries gone
                self.sessions.clear()
        return changing, reannounced


async def measure_agentic(
    store: RedisStore, ports: list[int], workers: int, batches: int, seed: int
) -> tuple[float, float, Cost]:
    """ingest_memory.py's agentic batches on workers of their own, one `apply` each, round
    robin, the second half measured: (changing, re-announced) block-events per batch and
    the cost."""
    counts = []
    settle, work = [], []
    for w in range(workers):
        worker = WorkerKey(f"agent-{w}", 0)
        payloads = agentic(2 * batches, seed + w)
        entries = Entries()
        for seq, payload in enumerate(payloads):
            counted = entries.count(payload)
            if seq < batches:
                settle.append((seq, worker, payload))
            else:
                work.append((seq, worker, payload))
                counts.append(counted)
    order = [(worker, seq, payload) for seq, worker, payload in sorted(settle + work)]
    await applied(store, ports, order[: len(settle)])
    cost = await applied(store, ports, order[len(settle) :])
    changing = sum(c for c, _ in counts) / len(counts)
    reannounced = sum(r for _, r in counts) / len(counts)
    return changing, reannounced, cost


def block_events(payload: bytes) -> int:
    batch = msgspec.msgpack.decode(payload, type=wire.KVEventBatch)
    return sum(
        len(e.block_hashes) for e in batch.events if not isinstance(e, wire.AllBlocksCleared)
    )


def server_cpu(ports: list[int]) -> float:
    """CPU seconds of every Redis node so far."""
    total = 0.0
    for port in ports:
        with redis.Redis(port=port) as client:
            info = client.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


async def prefilled(store: RedisStore, engines: list[Engine], sessions: int) -> None:
    """Each worker's prefill, in runs of 16 as a stream with a backlog writes it."""
    decoder = ingest_decoder()
    for w, engine in enumerate(engines):
        payloads = engine.prefill(sessions)
        first = engine.seq - len(payloads) + 1
        batches = []
        for i, payload in enumerate(payloads):
            decoded = decoder.decode(payload)
            batches.append(Batch(first + i, decoded.ts, decoded.events))
        for start in range(0, len(batches), 16):
            run = batches[start : start + 16]
            outcomes = await store.apply_many(WorkerKey(f"pod-{w}", 0), run)
            if any(o is not ApplyOutcome.APPLIED for o in outcomes):
                raise RuntimeError(f"worker pod-{w}: a prefill batch not applied: {outcomes}")


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    slope, intercept = statistics.linear_regression(*zip(*points, strict=True))
    return intercept, slope


async def run(args: argparse.Namespace) -> None:
    shapes = [(s, 0) for s in args.stores] + [(0, r) for r in args.reused]
    results: dict[tuple[int, int], list[Cost]] = {shape: [] for shape in shapes}
    paced: dict[float, list[Cost]] = {gap: [] for gap in args.gaps}
    with servers(args.redis, INTSET_ENTRIES) as (url, ports):
        store = RedisStore.from_url(url)
        engines = [Engine(args.seed + w) for w in range(args.workers)]
        await prefilled(store, engines, args.sessions)
        # Until every worker holds its steady blocks: each shape's batches evict as they store.
        await measure(store, ports, engines, 8, 0, STEADY_BLOCKS // (8 * BLOCKS_PER_STORE) + 1)
        agentic_run = await measure_agentic(
            store, ports, args.workers, args.agentic_batches, args.seed
        )  # fmt: skip
        idle = await idle_cores(ports)
        for n in range(args.runs):
            for shape in shapes if n % 2 == 0 else shapes[::-1]:
                stores, reused = shape
                cost = await measure(store, ports, engines, stores, reused, args.batches)
                results[shape].append(cost)
            for gap in args.gaps if n % 2 == 0 else args.gaps[::-1]:
                pace = Pace(gap / 1000, idle)
                cost = await measure(
                    store, ports, engines, PACED_STORES, 0, args.paced_batches, pace
                )
                paced[gap].append(cost)
        await store.close()
    medians = print_shapes(results)
    print_fit(args, medians, agentic_run)
    if args.gaps:
        print_paced(paced, results[(PACED_STORES, 0)], PacedScale(len(ports), idle))


async def idle_cores(ports: list[int]) -> float:
    """The servers' CPU at rest (cores), over `IDLE_SECONDS` without calls."""
    before = server_cpu(ports)
    started = time.monotonic()
    await asyncio.sleep(IDLE_SECONDS)
    return (server_cpu(ports) - before) / (time.monotonic() - started)


def print_shapes(
    results: dict[tuple[int, int], list[Cost]],
) -> dict[tuple[int, int], tuple[float, float, float]]:
    """The table of medians per shape; (block-events, Redis µs, ingest µs) per batch."""
    print("| stores | re-announced | block-events/batch | Redis µs/batch | ingest µs/batch |")
    print("|---:|---:|---:|---:|---:|")
    medians = {}
    for shape, costs in results.items():
        redis_us = statistics.median(c.redis_us for c in costs)
        client_us = statistics.median(c.client_us for c in costs)
        medians[shape] = (costs[0].block_events, redis_us, client_us)
        row = (*shape, f"{costs[0].block_events:.0f}", f"{redis_us:.0f}", f"{client_us:.0f}")
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    return medians


def print_fit(
    args: argparse.Namespace,
    medians: dict[tuple[int, int], tuple[float, float, float]],
    agentic_run: tuple[float, float, Cost],
) -> None:
    changing = [medians[(s, 0)] for s in args.stores]
    reused = [medians[(0, r)] for r in args.reused]
    got, announced, cost = agentic_run
    print(
        f"agentic, one apply per batch: {got:.1f} changing + {announced:.1f} re-announced "
        f"block-events per batch; Redis {cost.redis_us:.0f} µs, ingest {cost.client_us:.0f} µs"
    )
    for name, index, measured in (("Redis", 1, cost.redis_us), ("ingest", 2, cost.client_us)):
        a, b = fit([(m[0], m[index]) for m in changing])
        c0, c = fit([(m[0], m[index]) for m in reused])
        print(
            f"{name}: {a:.1f} µs per call + {b:.2f} µs per changing block-event "
            f"(re-announcing: {c0:.1f} µs per call + {c:.2f} µs per block-event); "
            f"agentic by the fit {a + b * got + c * announced:.0f} µs, measured {measured:.0f}"
        )


def print_paced(
    paced: dict[float, list[Cost]], back_to_back: list[Cost], cluster: PacedScale
) -> None:
    """The paced batches' medians against the same shape back to back, with the applies per
    second each ingest process and each shard saw."""
    redis_us = statistics.median(c.redis_us for c in back_to_back)
    client_us = statistics.median(c.client_us for c in back_to_back)
    print(
        f"\n{PACED_STORES}-store batches paced (the servers at rest: {cluster.idle_cores:.4f} "
        f"cores, taken out), against the same back to back"
    )
    print(
        "| ms between applies | applies/s | per shard | Redis µs/batch | x back to back "
        "| ingest µs/batch | x back to back |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rows = [("back to back", back_to_back)] + [(f"{gap:g}", costs) for gap, costs in paced.items()]
    for name, costs in rows:
        rate = statistics.median(c.calls_per_second for c in costs)
        paced_redis = statistics.median(c.redis_us for c in costs)
        paced_client = statistics.median(c.client_us for c in costs)
        print(
            f"| {name} | {rate:,.0f} | {rate / cluster.shards:,.0f} | {paced_redis:.0f} | "
            f"{paced_redis / redis_us:.2f} | {paced_client:.0f} | {paced_client / client_us:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--redis", choices=["standalone", "cluster"], default="standalone")
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument(
        "--sessions",
        type=int,
        default=10_000,
        help="prefilled 10-block prompts per worker (10,000: the worked example's entries)",
    )
    parser.add_argument(
        "--stores", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16, 32]
    )
    parser.add_argument(
        "--reused", type=lambda s: [int(x) for x in s.split(",")], default=[2, 8, 32]
    )
    parser.add_argument("--batches", type=int, default=50, help="per worker and shape")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--gaps",
        type=lambda s: [float(x) for x in s.split(",")] if s else [],
        default=[1.0, 3.0, 10.0, 30.0],
        help="ms between paced applies (empty: none)",
    )
    parser.add_argument("--paced-batches", type=int, default=10, help="per worker and gap")
    parser.add_argument("--agentic-batches", type=int, default=300, help="per worker, twice")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if args.gaps and PACED_STORES not in args.stores:
        parser.error(f"--gaps compares with the {PACED_STORES}-store shape: add it to --stores")
    if len(args.stores) < 2 or len(args.reused) < 2:
        parser.error("--stores and --reused: two shapes each at least, to fit a line")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
