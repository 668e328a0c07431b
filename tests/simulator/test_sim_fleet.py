"""The fleet: endpoints, bounded runs, streams that reproduce the engines' truth, faults."""

from __future__ import annotations

import asyncio
import random

import msgspec
import pytest
import zmq
import zmq.asyncio

from kvsi.loops import loop_factory
from kvsi.simulator import fleet as fleet_module
from kvsi.simulator.fleet import FleetBindError, SimulatedFleet, pod_names, simulate
from kvsi.subscriber.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from tests.ports import free_port_run
from tests.simulator.peers import recv, replay, replay_request, seq_of, subscribe

pytestmark = pytest.mark.timeout(60)


class Mirror:
    """DESIGN.md's index semantics for one worker, fed from the decoded stream."""

    def __init__(self) -> None:
        self.blocks: set[int] = set()
        self.sessions: dict[str, set[int]] = {}
        self.seqs: list[int] = []

    def apply(self, frames: list[bytes]) -> None:
        self.seqs.append(seq_of(frames))
        for event in msgspec.msgpack.decode(frames[2], type=KVEventBatch).events:
            if isinstance(event, BlockStored):
                hashes = {h for h in event.block_hashes if isinstance(h, int)}
                self.blocks |= hashes
                if event.session_id is not None:
                    self.sessions.setdefault(event.session_id, set()).update(hashes)
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    assert isinstance(h, int)
                    self.blocks.discard(h)
                    for owned in self.sessions.values():
                        owned.discard(h)
            else:
                self.blocks.clear()
                self.sessions.clear()

    def residency(self) -> dict[str, set[int]]:
        return {sid: owned for sid, owned in self.sessions.items() if owned}


def small_fleet(ctx: zmq.asyncio.Context, **kwargs: object) -> SimulatedFleet:
    options: dict[str, object] = {"sessions": 6, "seed": 11, "num_blocks": 400, "context": ctx}
    options.update(kwargs)
    return SimulatedFleet(**options)  # type: ignore[arg-type]


def test_pod_names_are_letters() -> None:
    assert pod_names(3) == ["pod-a", "pod-b", "pod-c"]
    assert pod_names(28)[26:] == ["pod-ba", "pod-bb"]


def test_a_pool_smaller_than_one_session_context_is_refused() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        SimulatedFleet(num_blocks=10)


async def test_each_pod_publishes_its_own_topic_on_its_own_endpoints(
    ctx: zmq.asyncio.Context,
) -> None:
    async with small_fleet(ctx) as fleet:
        endpoints = fleet.endpoints()
        assert [pod for pod, _, _ in endpoints] == ["pod-a", "pod-b", "pod-c"]
        addresses = [a for _, pub, rep in endpoints for a in (pub, rep)]
        assert len(set(addresses)) == 6
        assert all(a.startswith("tcp://127.0.0.1:") for a in addresses)
        assert [fleet.publisher(p).topic for p in fleet.pods] == [
            "kv@pod-a@model",
            "kv@pod-b@model",
            "kv@pod-c@model",
        ]
        with pytest.raises(KeyError, match="known: pod-a/0"):
            fleet.engine("pod-z")


async def test_the_streams_rebuild_exactly_the_engines_truth(ctx: zmq.asyncio.Context) -> None:
    async with small_fleet(ctx, migrate_prob=0.3) as fleet:
        subs = {pod: await subscribe(ctx, fleet.publisher(pod)) for pod in fleet.pods}
        mirrors = {pod: Mirror() for pod in fleet.pods}
        try:
            stats = await fleet.run(0, max_batches=40)
            for pod, sub in subs.items():
                for _ in range(fleet.publisher(pod).next_seq):
                    mirrors[pod].apply(await recv(sub))
        finally:
            for sub in subs.values():
                sub.close(linger=0)
        assert stats.ticks == 40
        assert stats.batches == sum(fleet.publisher(p).next_seq for p in fleet.pods)
        spread = set()
        for pod, mirror in mirrors.items():
            assert mirror.seqs == list(range(len(mirror.seqs)))
            assert mirror.blocks == fleet.resident(pod)
            assert mirror.residency() == fleet.session_residency(pod)
            assert fleet.resident(pod)
            spread |= set(fleet.session_residency(pod))
        # Migration puts some session on more than one worker.
        assert any(len(fleet.session_truth(s)) > 1 for s in spread)


async def test_same_seed_gives_the_same_blocks_on_every_pod(ctx: zmq.asyncio.Context) -> None:
    async with small_fleet(ctx) as one, small_fleet(ctx) as two:
        await one.run(0, max_batches=15)
        await two.run(0, max_batches=15)
        for pod in one.pods:
            assert one.resident(pod) == two.resident(pod)
            assert one.session_residency(pod) == two.session_residency(pod)


async def test_a_paced_run_stops_after_its_duration(ctx: zmq.asyncio.Context) -> None:
    """It ticks no faster than its rate over the time it ran, and stops once its duration
    has passed. How many ticks a busy machine fits in is not asserted: a shared CI machine
    once fell well short of the rate's count."""
    async with small_fleet(ctx) as fleet:
        loop = asyncio.get_running_loop()
        began = loop.time()
        stats = await fleet.run(40, duration=0.3)
        elapsed = loop.time() - began
    assert 0.25 <= elapsed < 5
    assert 1 <= stats.ticks <= 40 * stats.seconds + 2


async def test_stop_ends_a_background_run(ctx: zmq.asyncio.Context) -> None:
    async with small_fleet(ctx) as fleet:
        task = fleet.run_in_background(100)
        await asyncio.sleep(0.1)
        fleet.stop()
        stats = await asyncio.wait_for(task, 5)
        assert stats.ticks > 0
        assert fleet.stats.ticks == stats.ticks


async def test_close_waits_for_a_running_tick(ctx: zmq.asyncio.Context) -> None:
    fleet = small_fleet(ctx)
    await fleet.start()
    task = fleet.run_in_background(0)
    await asyncio.sleep(0.05)
    await fleet.close()
    stats = await asyncio.wait_for(task, 5)
    assert stats.ticks > 0


async def test_restart_pod_empties_it_and_restarts_seq_on_the_same_endpoints(
    ctx: zmq.asyncio.Context,
) -> None:
    async with small_fleet(ctx) as fleet:
        await fleet.run(0, max_batches=10)
        before = fleet.endpoints()
        assert fleet.publisher("pod-b").next_seq > 0
        await fleet.restart_pod("pod-b")
        assert fleet.endpoints() == before
        assert fleet.publisher("pod-b").next_seq == 0
        assert fleet.resident("pod-b") == set()
        assert fleet.resident("pod-a")
        sub = await subscribe(ctx, fleet.publisher("pod-b"))
        try:
            await fleet.run(0, max_batches=3)
            assert seq_of(await recv(sub)) == 0
        finally:
            sub.close(linger=0)


async def test_reset_pod_publishes_all_blocks_cleared(ctx: zmq.asyncio.Context) -> None:
    async with small_fleet(ctx) as fleet:
        await fleet.run(0, max_batches=5)
        seq = fleet.publisher("pod-a").next_seq
        await fleet.reset_pod("pod-a")
        assert fleet.resident("pod-a") == set()
        assert fleet.session_residency("pod-a") == {}
        _, _, replay_endpoint = fleet.endpoints()[0]
        replies = await replay(ctx, replay_endpoint, replay_request(seq))
    (reply, _end) = replies
    batch = msgspec.msgpack.decode(reply[3], type=KVEventBatch)
    assert batch.events == [AllBlocksCleared()]


async def test_base_port_lays_out_ranks_at_port_plus_rank(ctx: zmq.asyncio.Context) -> None:
    base = free_port_run(8)
    async with small_fleet(ctx, pods=2, dp_size=2, base_port=base) as fleet:
        workers = fleet.workers()
        assert [(w.pod, w.dp_rank) for w in workers] == [
            ("pod-a", 0),
            ("pod-a", 1),
            ("pod-b", 0),
            ("pod-b", 1),
        ]
        ports = [
            (w.endpoint.rsplit(":", 1)[1], w.replay_endpoint.rsplit(":", 1)[1]) for w in workers
        ]
        assert ports == [
            (str(base), str(base + 2)),
            (str(base + 1), str(base + 3)),
            (str(base + 4), str(base + 6)),
            (str(base + 5), str(base + 7)),
        ]
        assert fleet.endpoints()[1] == (
            "pod-b",
            f"tcp://127.0.0.1:{base + 4}",
            f"tcp://127.0.0.1:{base + 6}",
        )
        await fleet.run(0, max_batches=5)
        assert fleet.publisher("pod-a", 1).data_parallel_rank == 1
        assert fleet.resident("pod-a", 1)


async def test_auto_ports_keep_ranks_consecutive(ctx: zmq.asyncio.Context) -> None:
    async with small_fleet(ctx, pods=1, dp_size=2) as fleet:
        rank0, rank1 = fleet.workers()
        port = int(rank0.endpoint.rsplit(":", 1)[1])
        assert rank1.endpoint.endswith(f":{port + 1}")
        assert rank0.replay_endpoint.endswith(f":{port + 2}")


async def test_auto_ports_move_past_a_range_someone_holds(
    ctx: zmq.asyncio.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A range whose second rank's port is taken is given up for another, not an error."""
    holder = ctx.socket(zmq.PUB)
    for seed in range(50):
        first = random.Random(seed).randrange(20_000, 60_000)
        try:
            holder.bind(f"tcp://127.0.0.1:{first + 1}")
            break
        except zmq.ZMQError:
            continue
    else:
        pytest.fail("no seed's second port was free to hold")
    monkeypatch.setattr(fleet_module, "_PORT_RNG", random.Random(seed))
    tried: list[int | None] = []
    bind = SimulatedFleet._bind_pod

    async def counted(self: SimulatedFleet, pod: str, at: int | None, **kwargs: float) -> None:
        tried.append(at)
        await bind(self, pod, at, **kwargs)

    monkeypatch.setattr(SimulatedFleet, "_bind_pod", counted)
    try:
        async with small_fleet(ctx, pods=1, dp_size=2) as fleet:
            rank0, rank1 = fleet.workers()
            port = int(rank0.endpoint.rsplit(":", 1)[1])
            assert tried[0] == first and len(tried) >= 2 and port == tried[-1]
            assert rank1.endpoint.endswith(f":{port + 1}")
    finally:
        holder.close(linger=0)


async def test_auto_ports_give_up_on_other_bind_errors(
    ctx: zmq.asyncio.Context,
) -> None:
    """Not an address of this host: no other range would do, the first error is the one."""
    with pytest.raises(FleetBindError, match="cannot bind") as caught:
        async with small_fleet(ctx, pods=1, dp_size=2, host="192.0.2.1"):
            pass
    assert not caught.value.in_use


async def test_simulate_serves_for_its_duration() -> None:
    loop = asyncio.get_running_loop()
    began = loop.time()
    await asyncio.wait_for(
        simulate(pods=2, base_port=0, rate=20, sessions=4, seed=1, duration=0.2), 10
    )
    assert 0.15 <= loop.time() - began < 5


async def test_stop_right_after_starting_a_background_run_is_not_lost(
    ctx: zmq.asyncio.Context,
) -> None:
    async with small_fleet(ctx) as fleet:
        task = fleet.run_in_background(10)
        fleet.stop()
        stats = await asyncio.wait_for(task, 5)
        assert stats.ticks <= 1


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_paced_run_sleeps_about_once_a_tick(loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """uvloop's timers count whole milliseconds and may fire one early: without slack in
    each wait, the run woke before its tick and spun on shorter waits (six sleeps a tick)."""
    sleeps: list[float] = []
    sleep = SimulatedFleet._sleep_or_stop

    async def counted(self: SimulatedFleet, seconds: float) -> None:
        sleeps.append(seconds)
        await sleep(self, seconds)

    monkeypatch.setattr(SimulatedFleet, "_sleep_or_stop", counted)

    async def main() -> int:
        async with SimulatedFleet(pods=1, sessions=2, seed=3, num_blocks=400) as fleet:
            stats = await fleet.run(50, max_batches=20)
        return stats.ticks

    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        ticks = runner.run(main())
    assert ticks == 20
    assert len(sleeps) <= 2 * ticks, sleeps
