"""Does memory stay flat under endless session churn? A simulated day of agentic sessions
that all share a hot system prompt (never evicted), on the memory store and on Redis.

Run: `.venv/bin/python bench/soak_sessions.py` (see bench/README.md "Soak"). A fake clock:
batches carry simulated engine times and the janitor's `sweep` is called with the same
clock, so a day runs in minutes. Every batch goes through `IndexStore.apply`. Prints the
memory curve over simulated time and whether the index is exact for the sessions inside the
idle horizon (against a reference model of the workload and of the idle rule); asserts
nothing. The Redis part starts its own redis-server (as ingest_redis.py does).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import redis
from ingest_redis import redis_server, store_at

from kvsi.janitor import sweep
from kvsi.logs import configure_logging
from kvsi.store.base import IndexStore
from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, EntriesRemoved, EntriesStored, StoreEvent, WorkerKey
from kvsi.store.redis import RedisStore

LONG_GAP = 1800.0
"""A returning turn comes back 1-2 times this late: after the default idle horizon, so its
session was forgotten and starts again (the same gaps whether expiry is on or off)."""


@dataclass
class Session:
    """One agentic session of the workload: a worker, turns left, its next turn's time."""

    sid: str
    worker: int
    turns: int
    due: float
    last: int | None = None
    """Its last stored block (the next turn's parent)."""


@dataclass
class Reference:
    """What the index must say: per worker the resident blocks (session blocks in eviction
    order, the prompt apart), per (session, worker) the blocks held and the last store."""

    prompt: list[int]
    track: bool
    """Whether sessions are followed (expiry on); off, only the workers' blocks are."""
    resident: list[OrderedDict[int, str]] = field(default_factory=list)
    held: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    last_store: dict[tuple[str, int], float] = field(default_factory=dict)

    def store(self, sid: str, w: int, own: list[int], t: float) -> None:
        if self.track:
            self.held.setdefault((sid, w), set()).update(self.prompt, own)
            self.last_store[(sid, w)] = t
        for h in own:
            self.resident[w][h] = sid

    def evict(self, w: int, capacity: int) -> list[int]:
        out = []
        pool = self.resident[w]
        while len(pool) > capacity:
            h, sid = pool.popitem(last=False)
            out.append(h)
            blocks = self.held.get((sid, w))
            if blocks is not None:
                blocks.discard(h)
        return out

    def expire(self, older_than: float) -> None:
        """The idle rule: residencies last stored before `older_than` go; blocks stay."""
        for key in [k for k, t in self.last_store.items() if t < older_than]:
            del self.last_store[key]
            for h in self.held.pop(key):
                if self.resident[key[1]].get(h) == key[0]:
                    self.resident[key[1]][h] = ""  # held by no session now


@dataclass
class Workload:
    args: argparse.Namespace
    rng: random.Random
    ref: Reference
    active: list[Session] = field(default_factory=list)
    next_sid: int = 0
    next_hash: int = 1 << 20
    seqs: list[int] = field(default_factory=list)

    def arrivals(self, t: float, step: float) -> None:
        n = self.rng.random() * 2 * self.args.rate * step  # mean rate x step
        for _ in range(round(n)):
            self.next_sid += 1
            self.active.append(
                Session(
                    f"s{self.next_sid}",
                    self.rng.randrange(self.args.workers),
                    self.rng.randint(2, 8),
                    t + self.rng.random() * step,
                )
            )

    def batches(self, t: float, step: float) -> list[tuple[int, Batch]]:
        """The events of the step ending at t + step, one batch per worker."""
        events: list[list[StoreEvent]] = [[] for _ in range(self.args.workers)]
        keep = []
        for s in self.active:
            if s.due >= t + step:
                keep.append(s)
                continue
            own = list(range(self.next_hash, self.next_hash + self.rng.randint(4, 16)))
            self.next_hash += len(own)
            prompt = self.ref.prompt
            events[s.worker] += [
                EntriesStored(prompt, "GPU", 0, s.sid, None, 16),  # a reuse report of the prompt
                EntriesStored(own, "GPU", 0, s.sid, s.last or prompt[-1], 16),
            ]
            self.ref.store(s.sid, s.worker, own, t + step)
            s.last = own[-1]
            s.turns -= 1
            if s.turns:
                # Think time; one turn in ten comes back after LONG_GAP (past the horizon).
                long = self.rng.random() < 0.1
                gap = LONG_GAP * (1 + self.rng.random()) if long else self.rng.uniform(20, 240)
                s.due += gap
                keep.append(s)
        self.active = keep
        out = []
        for w in range(self.args.workers):
            gone = self.ref.evict(w, self.args.capacity)
            if gone:
                events[w].append(EntriesRemoved(gone, "GPU", 0))
            if events[w]:
                out.append((w, Batch(self.seqs[w], t + step, events[w])))
                self.seqs[w] += 1
        return out


def pod(w: int) -> str:
    return f"pod-{w}"


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def exact(store: IndexStore, ref: Reference, workers: int) -> tuple[bool, str]:
    """Whether the store lists exactly the reference's live sessions, with their blocks per
    worker, and each worker's blocks."""
    live: dict[str, dict[int, set[int]]] = {}
    for (sid, w), blocks in ref.held.items():
        live.setdefault(sid, {})[w] = blocks
    listed: set[str] = set()
    cursor = None
    while True:
        page = await store.list_sessions(pod=None, limit=1000, cursor=cursor)
        listed.update(s.session_id for s in page.items)
        cursor = page.next_cursor
        if cursor is None:
            break
    if listed != set(live):
        return False, f"{len(listed - set(live))} extra, {len(set(live) - listed)} missing sessions"
    for sid, by_worker in live.items():
        for w, blocks in by_worker.items():
            page = await store.session_blocks(
                sid, pod=pod(w), medium=None, limit=100_000, cursor=None
            )
            got = set() if page is None else {int(h) for h in page.items}
            if got != blocks:
                return False, f"{sid} on {pod(w)}: {len(got)} blocks, expected {len(blocks)}"
    for w in range(workers):
        page = await store.worker_blocks(
            pod(w), dp_rank=None, medium=None, limit=10**6, cursor=None
        )
        got = set() if page is None else {int(h) for h in page.items}
        if got != {*ref.prompt, *ref.resident[w]}:
            return False, f"{pod(w)}: blocks differ"
    return True, f"{len(live)} sessions"


async def soak(
    name: str, store: IndexStore, args: argparse.Namespace, memory: redis.Redis | None
) -> None:
    rng = random.Random(args.seed)
    prompt = list(range(1, args.prompt + 1))
    expire = args.idle > 0
    ref = Reference(prompt, expire, [OrderedDict() for _ in range(args.workers)])
    load = Workload(args, rng, ref, seqs=[0] * args.workers)
    print(f"\n{name}: {args.hours} h simulated, idle horizon {args.idle:.0f} s, "
          f"expiry {'on' if expire else 'off'}")  # fmt: skip
    print(f"{'sim h':>6} {'sessions':>9} {'started':>9} {'residencies':>11} {'memory MB':>10} "
          f"{'RSS MB':>7} {'exact':>6}  detail")  # fmt: skip
    began = time.monotonic()
    t, end, step = 0.0, args.hours * 3600.0, args.step
    next_sweep, next_sample, next_check = args.janitor, args.sample, args.check
    while t < end:
        load.arrivals(t, step)
        for w, batch in load.batches(t, step):
            await store.apply(WorkerKey(pod(w), 0), batch)
        t += step
        if expire and t >= next_sweep:
            await sweep(store, now=t, session_idle=args.idle, worker_grace=1e12)
            ref.expire(t - args.idle)
            next_sweep += args.janitor
        if t >= next_sample:
            check, detail = "", ""
            if t >= next_check:
                ok, detail = await exact(store, ref, args.workers) if expire else (False, "")
                check = ("yes" if ok else "NO") if expire else "-"
                next_check += args.check
            sessions = len({sid for sid, _ in ref.held}) if expire else load.next_sid
            used, rss = measure(memory)
            held = await residencies(store, args.workers)
            print(f"{t / 3600:>6.1f} {sessions:>9,} {load.next_sid:>9,} {held:>11,} "
                  f"{used:>10.1f} {rss:>7.1f} {check:>6}  {detail}")  # fmt: skip
            next_sample += args.sample
    print(f"({time.monotonic() - began:.0f} s wall; sessions: inside the horizon (expiry on) "
          f"or ever stored (off); started: sessions arrived so far)")  # fmt: skip


async def residencies(store: IndexStore, workers: int) -> int:
    """Session residencies the index holds, summed over the workers (as the index's own
    counts say): the memory store's, or the residency hashes' lengths in Redis."""
    if isinstance(store, MemoryStore):
        return sum(len(w.sessions) for w in store._workers.values())
    assert isinstance(store, RedisStore)
    return sum(
        [
            await store._client.hlen(store.worker_keys(WorkerKey(pod(w), 0)).res)
            for w in range(workers)
        ]
    )


def measure(memory: redis.Redis | None) -> tuple[float, float]:
    """The store's memory (Redis `used_memory`, or this process's RSS for the memory store)
    and this process's RSS (for Redis: the writer's mirrors), in MB."""
    gc.collect()
    rss = rss_mb()
    if memory is None:
        return rss, rss
    return float(memory.info("memory")["used_memory"]) / 2**20, rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", choices=["memory", "redis", "both"], default="both")
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours")
    parser.add_argument("--rate", type=float, default=0.5, help="new sessions per second")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=32, help="blocks of the shared prompt")
    parser.add_argument("--capacity", type=int, default=20_000, help="session blocks per worker")
    parser.add_argument("--idle", type=float, default=1800.0, help="session_idle_seconds; 0: off")
    parser.add_argument("--step", type=float, default=10.0, help="simulated seconds per batch")
    parser.add_argument("--janitor", type=float, default=30.0, help="janitor interval")
    parser.add_argument("--sample", type=float, default=3600.0, help="seconds between samples")
    parser.add_argument("--check", type=float, default=6 * 3600.0, help="seconds between checks")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    configure_logging("warning", "console")  # the janitor logs a line per pass
    if args.store in ("memory", "both"):
        asyncio.run(soak("memory store (RSS of this process)", MemoryStore(), args, None))
    if args.store in ("redis", "both"):
        with redis_server(512) as port:
            client = redis.Redis(port=port)

            async def run() -> None:
                store = store_at(port)
                try:
                    await soak("redis store (used_memory)", store, args, client)
                finally:
                    await store.close()

            asyncio.run(run())


if __name__ == "__main__":
    main()
