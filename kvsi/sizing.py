"""The sizing model: a fleet's description in, Redis shards, processes and headroom out.

Pure arithmetic: no I/O, imports nothing of the service. `kvsi size` prints `render(plan(...))`
and deploy/SIZING.md states each formula in words; the figures it multiplies are the fields
of `Measured`, each named after the bench/README.md section that measured it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

GIB = 1024**3
LoadCurve = tuple[tuple[float, float], ...]
"""(applies per second one unit receives, its CPU per apply over the same applies back to
back), by rising rate; the busiest point is the back-to-back one (1.0)."""
FEED_LENGTH = 1_000
"""Records kept per worker's change feed: the Redis store's `feed_length` default."""
CLUSTER_MIN_MASTERS = 3
"""A Redis Cluster needs at least three masters; fewer shards than that is one Redis."""


@dataclass(frozen=True)
class Measured:
    """The measured constants, as bench/README.md prints them. Update them here, from the
    section each docstring names, when a bench is run again; nothing else holds a figure."""

    redis_bytes_per_entry: float = 8.4
    """Bytes of Redis `used_memory` per resident (session, block) entry beyond its session
    and its block: its member in the session's set. redis_memory_shape.py."""

    redis_bytes_per_session: float = 517.3
    """Bytes per session on a worker: its set's key, its residency, its directory members.
    redis_memory_shape.py."""

    redis_bytes_per_prompt_start: float = 271.2
    """Bytes per block stored with no parent (a prompt's start, asserted in the worker's
    block directory). redis_memory_shape.py."""

    redis_bytes_per_block: float = 9.3
    """Bytes per distinct resident block of a worker: its member in the entry index, with
    `set-max-intset-entries 4096` as deploy/README.md recommends. redis_memory_shape.py."""

    redis_feed_bytes_per_record: float = 1_171.0
    """Bytes per change-feed record (of 64 residencies); a worker keeps `FEED_LENGTH`.
    redis_memory_shape.py."""

    redis_us_per_call: float = 145.5
    """µs of Redis CPU per apply call beyond its block-events (the fence, the version log,
    the change feed's record, each touched session's residency): the line's intercept over
    batches of 8 to 256 changing block-events, one apply each, back to back, round robin
    over 10 workers of 100,000 entries on a 3-master cluster. redis_apply_cost.py, "Session
    25" (the median of three runs)."""

    redis_us_per_changing_event: float = 2.44
    """µs of Redis CPU per block-event that changes the index (a new (session, block)
    entry, an evicted block): the same line's slope. redis_apply_cost.py, "Session 25"."""

    redis_us_per_reannounced_event: float = 0.49
    """µs of Redis CPU per block-event re-announcing an entry the session already holds (a
    reuse report): the slope over re-announcing batches. redis_apply_cost.py, "Session
    25"."""

    ingest_us_per_call: float = 223.4
    """µs of the ingest process's CPU per apply call (decode, plan, I/O), the same fit as
    `redis_us_per_call`. redis_apply_cost.py, "Session 25"."""

    ingest_us_per_changing_event: float = 3.06
    """µs of ingest CPU per changing block-event. redis_apply_cost.py, "Session 25"."""

    ingest_us_per_reannounced_event: float = 1.31
    """µs of ingest CPU per re-announced block-event. redis_apply_cost.py, "Session 25"."""

    redis_light_load: LoadCurve = (
        (10.0, 1.48),
        (29.0, 1.38),
        (79.0, 1.21),
        (172.0, 1.03),
        (430.0, 1.0),
    )
    """A Redis shard's CPU per apply at so many applies per second, over the same applies
    back to back (the figures above): a shard that rests between calls pays more for each
    (its caches gone cold, a wake-up per call). redis_apply_cost.py, "Session 25", 8-store
    batches paced (each point the median of three runs)."""

    ingest_light_load: LoadCurve = (
        (31.0, 2.67),
        (86.0, 2.37),
        (236.0, 1.67),
        (516.0, 1.23),
        (1_289.0, 1.0),
    )
    """The same for an ingest process at so many applies per second (a sidecar's are its
    worker's batches; a central process's, its share of the fleet's). redis_apply_cost.py,
    "Session 25"."""

    redis_us_per_stream_second: float = 24.0
    """µs of Redis CPU per second per followed worker, batches or none: its stream's index
    audit and status write every `index_audit_seconds` (at its default, 5 s), and one API
    process's change-feed read of it. fleet_latency.py, "Session 21": the no-ingest idle
    window at 1,000 workers less the one at 10, over the 990 workers."""

    ingest_us_per_stream_second: float = 72.0
    """µs of ingest CPU per second per followed worker, batches or none (the same audits at
    the default period, the stream's timers and socket). fleet_latency.py, "Session 21",
    the same windows."""

    redis_us_per_session_lookup: float = 66.0
    """µs of Redis CPU per `get_session` at 1,000 workers. directory_reads.py, "Reads that
    cost the same at every fleet size"."""

    redis_us_per_prefix_match: float = 125.0
    """µs of Redis CPU per `match_prefix` at 1,000 workers. directory_reads.py, "Reads that
    cost the same at every fleet size"."""

    redis_commands_per_route: int = 5 + 15
    """Redis commands per route: a session lookup (5) and a prefix match (15), flat in the
    fleet's size. directory_reads.py, "after"."""

    client_us_per_session_lookup: float = 157.0
    """µs of the API process's CPU per `get_session` at 1,000 workers. directory_reads.py,
    "Reads that cost the same at every fleet size"."""

    client_us_per_prefix_match: tuple[tuple[int, float], ...] = ((100, 117.0), (1_000, 177.0))
    """(workers, µs of the API process's CPU per `match_prefix`) as measured, nearly flat.
    directory_reads.py, "Reads that cost the same at every fleet size"."""

    api_us_per_route: float = 586.0
    """µs of `kvsi serve`'s CPU per `POST /v1/route` over HTTP on the memory store (100
    workers): the HTTP server, the app, the memory store's reads, the log line.
    api_cpu.py, "For the sizing model, the native core"."""

    memory_store_bytes_per_entry: float = 152.0
    """RSS bytes per entry of one process holding the memory store at 10,000,000 entries.
    memory_at_size.py, "For the sizing model, the native core"."""

    memory_store_apply_per_cpu_second: float = 953_558.0
    """Block-events the memory store applies per CPU second at 10,000,000 entries (decode and
    apply). memory_at_size.py, "For the sizing model, the native core"."""

    receive_us_per_batch: float = 35.0
    """µs per message `kvsi serve` spends around decode and apply (ZMQ receive, the stream's
    work) on agentic batches. ingest_e2e.py, "For the sizing model, the native core"."""

    def redis_bytes(self, fleet: Fleet) -> float:
        """The index in Redis: its entries, its sessions (each on one worker, starting its own
        prompt), its blocks, and every worker's change feed."""
        return (
            fleet.entries * self.redis_bytes_per_entry
            + fleet.sessions * (self.redis_bytes_per_session + self.redis_bytes_per_prompt_start)
            + fleet.workers * fleet.blocks_per_worker * self.redis_bytes_per_block
            + fleet.workers * FEED_LENGTH * self.redis_feed_bytes_per_record
        )

    def redis_us_per_block_event(self, fleet: Fleet) -> float:
        """Redis CPU per block-event of the fleet's batch shape on a busy shard: the call's
        share, and the block-event's by whether it changes the index or re-announces an
        entry."""
        return self.redis_us_per_call / fleet.batch_events + _mixed(
            fleet, self.redis_us_per_changing_event, self.redis_us_per_reannounced_event
        )

    def ingest_us_per_block_event(self, fleet: Fleet) -> float:
        """Ingest CPU per block-event of the fleet's batch shape in a busy process, as
        `redis_us_per_block_event`, with each message's receive around decode and apply."""
        per_batch = self.ingest_us_per_call + self.receive_us_per_batch
        return per_batch / fleet.batch_events + _mixed(
            fleet, self.ingest_us_per_changing_event, self.ingest_us_per_reannounced_event
        )

    def redis_us_per_route(self) -> float:
        return self.redis_us_per_session_lookup + self.redis_us_per_prefix_match

    def client_us_per_route(self, workers: int) -> float:
        """The API process's store reads for one route: the session lookup, flat, and the
        prefix match, on the line through its smallest and largest measured fleets."""
        (small, at_small), (large, at_large) = (
            self.client_us_per_prefix_match[0],
            self.client_us_per_prefix_match[-1],
        )
        prefix = at_small + (at_large - at_small) / (large - small) * (workers - small)
        return self.client_us_per_session_lookup + max(prefix, 0.0)

    def memory_store_us_per_block_event(self, fleet: Fleet) -> float:
        apply = 1e6 / self.memory_store_apply_per_cpu_second
        return apply + self.receive_us_per_batch / fleet.batch_events


def light_load(curve: LoadCurve, rate: float) -> float:
    """CPU per apply at `rate` applies/s on one unit, over the same back to back: the
    busiest point's factor at or above it (1.0 on the measured curves), the least busy
    point's below that point, and in between interpolated on log(rate); never less than at
    a busier point (the measured points are one run each: a lighter load is not taken to
    cost less)."""
    points = sorted(curve)
    ceiling = [max(f for _, f in points[i:]) for i in range(len(points))]
    if rate <= points[0][0]:
        return ceiling[0]
    for (low, _), (high, _), f_low, f_high in zip(
        points, points[1:], ceiling, ceiling[1:], strict=False
    ):
        if rate <= high:
            at = math.log(rate / low) / math.log(high / low)
            return f_low + (f_high - f_low) * at
    return ceiling[-1]


def _mixed(fleet: Fleet, changing: float, reannounced: float) -> float:
    """A per-block-event cost over the fleet's mix of changing and re-announced ones."""
    return (1 - fleet.reannounced) * changing + fleet.reannounced * reannounced


MEASURED = Measured()

EVENTS_PER_WORKER = 1_000.0
"""Block-events/s per worker when the user gives no rate (deploy/SIZING.md, the worked
example's agentic shape)."""
ENTRIES_PER_SESSION = 100
"""Entries per session when the user gives no session count (the worked example's)."""
ROUTES_PER_WORKER = 10.0
"""Routes/s per worker when the user gives no rate (the same shape)."""
BATCH_EVENTS = 44.2
"""Block-events per batch when the user gives none: the agentic workload's as
redis_apply_cost.py measures it ("Session 20": batches 300-600 of a fresh engine, before its
pool fills; the workload's batches grow and re-announce more as it runs)."""
REANNOUNCED = 0.51
"""Share of block-events re-announcing an entry when the user gives none: the same
batches'."""


@dataclass(frozen=True)
class Fleet:
    """What the user describes: the whole fleet's sizes and rates."""

    workers: int
    """Event publishers: pods x data-parallel ranks."""
    entries: int
    """Resident (session, block) entries over the fleet: each block counts once per session
    holding it."""
    sessions: int
    """Sessions inside the idle horizon."""
    blocks_per_worker: int
    """Resident blocks per worker (its KV cache in blocks, every medium)."""
    event_rate: float
    """Block-events per second over the fleet (blocks stored, reported and removed)."""
    query_rate: float
    """`POST /v1/route` per second over the fleet (a session lookup and a prefix match each)."""
    batch_events: float = BATCH_EVENTS
    """Block-events per batch an engine publishes (one batch per engine step with events)."""
    reannounced: float = REANNOUNCED
    """Share of block-events that re-announce an entry the session already holds (reuse
    reports); the rest change the index (new entries, evictions)."""


def describe(
    workers: int,
    entries: int,
    sessions: int | None = None,
    blocks_per_worker: int | None = None,
    event_rate: float | None = None,
    query_rate: float | None = None,
    batch_events: float | None = None,
    reannounced: float | None = None,
) -> Fleet:
    """A fleet from what the user gave; what is left out takes the worked example's shape
    (`ENTRIES_PER_SESSION`, one session per block, its rates per worker, the agentic
    workload's batches)."""
    return Fleet(
        workers=workers,
        entries=entries,
        sessions=sessions or max(1, round(entries / ENTRIES_PER_SESSION)),
        blocks_per_worker=blocks_per_worker or max(1, math.ceil(entries / workers)),
        event_rate=EVENTS_PER_WORKER * workers if event_rate is None else event_rate,
        query_rate=ROUTES_PER_WORKER * workers if query_rate is None else query_rate,
        batch_events=BATCH_EVENTS if batch_events is None else batch_events,
        reannounced=REANNOUNCED if reannounced is None else reannounced,
    )


@dataclass(frozen=True)
class Budget:
    """How full the plan lets each process and shard be."""

    cpu_share: float = 0.5
    """Share of one core a Redis shard or a kvsi process is planned to use (each is one event
    loop or one Redis thread: one core at most)."""
    memory_headroom: float = 2.0
    """Planned memory = the index's bytes x this: fragmentation, growth, a fork's copy."""
    shard_memory_gib: float = 25.0
    """Memory of one Redis shard (its `maxmemory`)."""
    process_memory_gib: float = 16.0
    """Memory of one kvsi process (its container limit)."""


@dataclass(frozen=True)
class Bottleneck:
    """One limit at its busiest unit: the load it carries and what it can carry."""

    name: str
    unit: str
    load: float
    capacity: float

    @property
    def headroom(self) -> float:
        """How many times the load fits before the limit (infinite for no load)."""
        return math.inf if self.load <= 0 else self.capacity / self.load


@dataclass(frozen=True)
class Plan:
    """The answer for one fleet."""

    fleet: Fleet
    budget: Budget
    shards: int
    shards_for_memory: int
    shards_for_cpu: int
    redis_bytes: float
    redis_cores: float
    ingest_cores: float
    """Over the central processes."""
    ingest_processes: int
    sidecar_cores: float
    """Of one sidecar, following one worker."""
    mirror_bytes: float
    api_cores: float
    api_processes: int
    memory_store_bytes: float
    memory_store_cores: float
    bottlenecks: tuple[Bottleneck, ...] = field(default=())

    @property
    def memory_store_fits(self) -> bool:
        """The whole index in one process: its memory and its one core within the budget."""
        return (
            self.memory_store_bytes * self.budget.memory_headroom
            <= self.budget.process_memory_gib * GIB
            and self.memory_store_cores <= self.budget.cpu_share
        )


def cluster_shards(needed: int) -> int:
    """Shards for a need: one Redis, or a cluster of at least three masters."""
    return 1 if needed <= 1 else max(needed, CLUSTER_MIN_MASTERS)


def units(load: float, per_unit: float) -> int:
    """Units of `per_unit` each that carry `load` (at least one)."""
    return max(1, math.ceil(load / per_unit - 1e-9))


def plan(
    fleet: Fleet,
    budget: Budget = Budget(),
    measured: Measured = MEASURED,
    shards: int | None = None,
) -> Plan:
    """Size a fleet: Redis shards by memory and by CPU, central ingest processes by CPU and
    by their mirrors' memory, API processes by CPU, and the memory store's one process."""
    redis_bytes = measured.redis_bytes(fleet)
    for_memory = units(redis_bytes * budget.memory_headroom, budget.shard_memory_gib * GIB)
    for_cpu = fewest(lambda n: redis_cores(fleet, measured, n), budget.cpu_share)
    chosen = shards if shards is not None else cluster_shards(max(for_memory, for_cpu))
    mirror_bytes = fleet.entries * measured.memory_store_bytes_per_entry
    ingest_processes = max(
        fewest(lambda n: ingest_cores(fleet, measured, n), budget.cpu_share),
        units(mirror_bytes * budget.memory_headroom, budget.process_memory_gib * GIB),
    )
    api_cores = fleet.query_rate * route_us(measured, fleet.workers) / 1e6
    api_processes = units(api_cores, budget.cpu_share)
    memory_store_cores = (
        fleet.event_rate * measured.memory_store_us_per_block_event(fleet)
        + fleet.query_rate * measured.api_us_per_route
    ) / 1e6
    sized = Plan(
        fleet=fleet,
        budget=budget,
        shards=chosen,
        shards_for_memory=for_memory,
        shards_for_cpu=for_cpu,
        redis_bytes=redis_bytes,
        redis_cores=redis_cores(fleet, measured, chosen),
        ingest_cores=ingest_cores(fleet, measured, ingest_processes),
        ingest_processes=ingest_processes,
        sidecar_cores=ingest_cores(fleet, measured, fleet.workers) / fleet.workers,
        mirror_bytes=mirror_bytes,
        api_cores=api_cores,
        api_processes=api_processes,
        memory_store_bytes=mirror_bytes,
        memory_store_cores=memory_store_cores,
    )
    return dataclasses.replace(sized, bottlenecks=bottlenecks(sized))


def applies_per_second(fleet: Fleet) -> float:
    """Apply calls over the fleet: one per batch (a stream keeping up applies each alone)."""
    return fleet.event_rate / fleet.batch_events


def redis_cores(fleet: Fleet, measured: Measured, shards: int) -> float:
    """Redis CPU of the fleet spread evenly over `shards`: the applies, each at the cost of
    the load a shard then sees (`light_load`), every stream's upkeep, the routes' reads."""
    rest = light_load(measured.redis_light_load, applies_per_second(fleet) / shards)
    applies = fleet.event_rate * measured.redis_us_per_block_event(fleet) * rest
    streams = fleet.workers * measured.redis_us_per_stream_second
    return (applies + streams + fleet.query_rate * measured.redis_us_per_route()) / 1e6


def ingest_cores(fleet: Fleet, measured: Measured, processes: int) -> float:
    """Ingest CPU of the fleet spread evenly over `processes` (central ones, or one sidecar
    per worker), each apply at the cost of the load a process then sees, and every
    stream's upkeep."""
    rest = light_load(measured.ingest_light_load, applies_per_second(fleet) / processes)
    applies = fleet.event_rate * measured.ingest_us_per_block_event(fleet) * rest
    return (applies + fleet.workers * measured.ingest_us_per_stream_second) / 1e6


def fewest(cores: Callable[[int], float], share: float) -> int:
    """The fewest units that each carry at most `share` of a core, the load spread evenly
    over them (`cores(n)`: the load on n units; more units rest more between applies, so
    the load grows with n, and never fits fewer units than it does one)."""
    count = units(cores(1), share)
    while cores(count) > count * share + 1e-9:
        count += 1
    return count


def route_us(measured: Measured, workers: int) -> float:
    """The API process's CPU per route on Redis: the HTTP and app path measured on the memory
    store (its own reads included, so this errs high) plus the Redis client's reads."""
    return measured.api_us_per_route + measured.client_us_per_route(workers)


def bottlenecks(sized: Plan) -> tuple[Bottleneck, ...]:
    """Each limit at its busiest unit, the fleet's load spread evenly over the units."""
    budget = sized.budget
    return (
        Bottleneck("Redis CPU per shard", "cores", sized.redis_cores / sized.shards, 1.0),
        Bottleneck(
            "Redis memory per shard",
            "GiB",
            sized.redis_bytes / sized.shards / GIB,
            budget.shard_memory_gib,
        ),
        Bottleneck(
            "ingest CPU per central process",
            "cores",
            sized.ingest_cores / sized.ingest_processes,
            1.0,
        ),
        Bottleneck(
            "ingest memory per central process",
            "GiB",
            sized.mirror_bytes / sized.ingest_processes / GIB,
            budget.process_memory_gib,
        ),
        Bottleneck("ingest CPU per sidecar", "cores", sized.sidecar_cores, 1.0),
        Bottleneck("API CPU per process", "cores", sized.api_cores / sized.api_processes, 1.0),
    )


def shape(fleet: Fleet) -> tuple[float, float]:
    """The fleet's shape the per-entry figures depend on: entries per session and sessions
    holding each resident block."""
    return fleet.entries / fleet.sessions, fleet.entries / (fleet.workers * fleet.blocks_per_worker)


def shown_bytes(count: float) -> str:
    """Bytes in GiB, or in MiB below one GiB."""
    return f"{count / GIB:,.1f} GiB" if count >= GIB else f"{count / 2**20:,.0f} MiB"


def counted(count: int, noun: str) -> str:
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}es"


def render(sized: Plan, measured: Measured = MEASURED) -> str:
    """The plan as the lines `kvsi size` prints."""
    fleet, budget = sized.fleet, sized.budget
    per_session, per_block = shape(fleet)
    shards = "one Redis" if sized.shards == 1 else f"a Redis Cluster of {sized.shards} masters"
    lines = [
        f"fleet: {fleet.workers:,} workers, {fleet.entries:,} entries, {fleet.sessions:,} "
        f"sessions, {fleet.blocks_per_worker:,} blocks per worker",
        f"load: {fleet.event_rate:,.0f} block-events/s, {fleet.query_rate:,.0f} routes/s",
        f"batches: {fleet.batch_events:,.1f} block-events each, "
        f"{fleet.reannounced:.0%} of them re-announced",
        f"shape: {per_session:,.1f} entries per session, {per_block:,.2f} sessions per block",
        f"budget: {budget.cpu_share:.0%} of a core per shard and process, memory x "
        f"{budget.memory_headroom:g}, {budget.shard_memory_gib:g} GiB per shard, "
        f"{budget.process_memory_gib:g} GiB per process",
        "",
        f"Redis: {shards}: {sized.shards_for_memory} for memory, {sized.shards_for_cpu} for CPU",
        f"  index {shown_bytes(sized.redis_bytes)}, planned "
        f"{shown_bytes(sized.redis_bytes * budget.memory_headroom / sized.shards)} per shard",
        f"  CPU {sized.redis_cores:,.2f} cores, {sized.redis_cores / sized.shards:,.2f} per shard",
        f"ingest: {counted(sized.ingest_processes, 'central process')} for "
        f"{sized.ingest_cores:,.2f} cores, or one sidecar per worker at "
        f"{sized.sidecar_cores:,.4f} cores each",
        f"  mirrors {shown_bytes(sized.mirror_bytes)} in all, "
        f"{shown_bytes(sized.mirror_bytes / fleet.workers)} per sidecar",
        f"API: {counted(sized.api_processes, 'process')} for {sized.api_cores:,.2f} cores "
        f"({route_us(measured, fleet.workers):,.0f} µs per route)",
        f"memory store, one process: {shown_bytes(sized.memory_store_bytes)}, "
        f"{sized.memory_store_cores:,.2f} cores: "
        + ("fits" if sized.memory_store_fits else "does not fit"),
        "",
        f"{'bottleneck':<34} {'unit':<5} {'load':>8} {'capacity':>8} {'headroom':>8}",
    ]
    for limit in sized.bottlenecks:
        headroom = "-" if math.isinf(limit.headroom) else f"{limit.headroom:,.1f}x"
        lines.append(
            f"{limit.name:<34} {limit.unit:<5} {limit.load:>8,.3f} {limit.capacity:>8,.1f}"
            f" {headroom:>8}"
        )
    return "\n".join(lines)
