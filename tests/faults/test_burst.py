"""A burst over a small high-water mark (publisher) or a small ingest queue (ours): messages
are dropped, the gaps are repaired by replay, and the index ends equal to the engine."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import zmq.asyncio

from kvsi.simulator.engine import SimulatedEngine
from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.simulator.workload import AgenticWorkload
from kvsi.store.memory import MemoryStore
from kvsi.subscriber.stream import PublisherSpec
from tests.faults.harness import FAULTS, Sidecar, mismatches

pytestmark = pytest.mark.e2e

BURST = 5_000


class Pod:
    """One engine and its publisher, with the HWM the test chooses."""

    def __init__(self, ctx: zmq.asyncio.Context, hwm: int) -> None:
        self.engine = SimulatedEngine(num_blocks=512)
        self.workload = AgenticWorkload(sessions=12, seed=3)
        self.publisher = SimulatedPublisher(
            "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", hwm=hwm, context=ctx
        )

    def spec(self) -> PublisherSpec:
        return PublisherSpec("pod-a", self.publisher.endpoint, self.publisher.replay_endpoint)

    def prepare(self, batches: int) -> list[bytes]:
        """The payloads of `batches` engine steps, computed before the clock starts."""
        payloads = []
        for _ in range(batches):
            request = self.workload.next_request()
            assert request is not None
            events = self.engine.run_request(request.session_id, request.token_ids)
            payloads.append(self.publisher.encode(events))
        return payloads

    async def burst(self, payloads: list[bytes]) -> None:
        """Publish without yielding once: the subscriber's loop cannot read meanwhile, so
        ZMQ's pipes and the kernel's buffers fill, and PUB drops past its high-water mark."""
        for body in payloads:
            await self.publisher.publish_payload(body)


async def run_burst(ctx: zmq.asyncio.Context, hwm: int, queue_size: int) -> Sidecar:
    pod = Pod(ctx, hwm)
    await pod.publisher.start()
    payloads = pod.prepare(BURST)
    sidecar = Sidecar(MemoryStore(), [pod.spec()], replace(FAULTS, queue_size=queue_size))
    await sidecar.start()
    try:
        await sidecar.wait_states({"pod-a": "live"})
        await asyncio.sleep(0.2)  # the subscription reaches the PUB after the TCP connect
        await pod.burst(payloads)
        await sidecar.wait_caught_up({"pod-a": pod.publisher.next_seq}, within=30)
        assert await mismatches(sidecar.client, {"pod-a": pod.engine}) == []
        await sidecar.wait_states({"pod-a": "live"})
        return sidecar
    finally:
        await sidecar.stop()
        await pod.publisher.close()


async def test_a_burst_over_a_small_publisher_hwm_is_repaired_by_replay(
    ctx: zmq.asyncio.Context,
) -> None:
    sidecar = await run_burst(ctx, hwm=16, queue_size=FAULTS.queue_size)
    counters = sidecar.stream("pod-a").counters
    assert counters.gaps >= 1 and counters.batches_missed > 0, "the HWM dropped messages"
    assert counters.batches_lost == 0


async def test_a_burst_over_a_small_ingest_queue_is_repaired_by_replay(
    ctx: zmq.asyncio.Context,
) -> None:
    sidecar = await run_burst(ctx, hwm=0, queue_size=32)
    counters = sidecar.stream("pod-a").read_counters()
    assert counters.queue_overflow > 0, "our own queue dropped messages"
    assert sidecar.stream("pod-a").inbox.capacity == 32 and counters.queued == 0
    assert counters.batches_lost == 0 and counters.batches_replayed > 0
