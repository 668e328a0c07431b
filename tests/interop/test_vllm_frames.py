"""The simulator against vLLM: for the same requests, the same frames, live and replayed.

Both sides serve one worker's requests (agent turns on a pool small enough to evict, and a
prefix cache reset): vLLM's KVCacheManager behind its ZmqEventPublisher, and the simulator's
engine behind its publisher, as `kvsi simulate` runs them. What a SUB and a DEALER receive
must match frame for frame, payloads byte for byte but for the batch's timestamp.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio

from kvsi.simulator.engine import SimulatedEngine
from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.subscriber.wire import END_SEQ
from tests.interop.engines import BLOCK_SIZE, MODEL, Turn, VllmWorker, kv_events_config
from tests.ports import free_port_run
from tests.simulator.peers import RECV_TIMEOUT, nothing_within, recv, replay, replay_request

pytestmark = pytest.mark.interop

POD = "pod-a"
POOL = 20
"""Blocks either side can cache (vLLM's pool has one more: its null block)."""

TS = slice(2, 10)
"""The ts's bytes in a payload: after the array header and msgpack's float64 marker."""

Step = tuple[str, list[int]] | None
"""One batch: a request as (session, token ids), or None for a prefix cache reset."""

Frames = list[list[bytes]]


def agent_steps() -> list[Step]:
    """Four sessions on two system prompts, one turn per batch, each adding one or two blocks.

    Whole blocks: vLLM then holds no partial block, so both pools hold the same blocks. Every
    turn extends its session's context, so no prompt finds all of its blocks cached (vLLM
    would recompute the last one, the simulator would not).
    """
    rng = random.Random(7)

    def tokens(blocks: int) -> list[int]:
        return [rng.randrange(100, 32_000) for _ in range(blocks * BLOCK_SIZE)]

    prompts = [tokens(2), tokens(2)]
    contexts = {f"sess-{i}": list(prompts[i % 2]) for i in range(4)}
    steps: list[Step] = []
    for turn in range(8):
        if turn == 5:
            steps.append(None)
        for session, context in contexts.items():
            context.extend(tokens(1 + rng.randrange(2)))
            steps.append((session, list(context)))
    return steps


async def test_the_simulator_sends_vllms_frames_for_the_same_requests(
    ctx: zmq.asyncio.Context,
) -> None:
    steps = agent_steps()
    ports = free_port_run(2)
    worker = VllmWorker(POD, kv_events_config(POD, ports, ports + 1), num_blocks=POOL + 1)
    try:
        vllm_live, vllm_replay = await capture(
            ctx, worker.endpoint, worker.replay_endpoint, lambda: run_vllm(worker, steps)
        )
    finally:
        worker.close()
    async with SimulatedPublisher(
        "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", pod=POD, model=MODEL, context=ctx
    ) as publisher:
        assert publisher.replay_endpoint is not None
        sim_live, sim_replay = await capture(
            ctx,
            publisher.endpoint,
            publisher.replay_endpoint,
            lambda: run_simulator(publisher, steps),
        )

    kinds = Counter(type(e).__name__ for e in worker.published)
    assert kinds["BlockRemoved"] > 0 and kinds["AllBlocksCleared"] == 1 and worker.prefix_hits
    assert len(vllm_live) == worker.batches == len(steps)
    assert [decoded(m) for m in sim_live] == [decoded(m) for m in vllm_live]
    assert [masked(m) for m in sim_live] == [masked(m) for m in vllm_live]
    assert [decoded(m) for m in sim_replay] == [decoded(m) for m in vllm_replay]
    assert [masked(m) for m in sim_replay] == [masked(m) for m in vllm_replay]
    for live, replayed in ((vllm_live, vllm_replay), (sim_live, sim_replay)):
        assert [[b"", *m] for m in live] == replayed[:-1]
        assert replayed[-1] == [b"", b"", END_SEQ, b""]


async def run_vllm(worker: VllmWorker, steps: list[Step]) -> int:
    """Each step's request generates one token, so it is served (and published) in one step."""
    for step in steps:
        if step is None:
            worker.reset_prefix_cache()
            continue
        worker.submit(Turn(*step, output=[0]))
        worker.step()
        assert worker.idle
    return worker.batches


async def run_simulator(publisher: SimulatedPublisher, steps: list[Step]) -> int:
    engine = SimulatedEngine(num_blocks=POOL, block_size=BLOCK_SIZE)
    for step in steps:
        if step is None:
            await publisher.publish(engine.reset())
            continue
        await publisher.publish(engine.run_request(*step))
    return publisher.next_seq


async def capture(
    ctx: zmq.asyncio.Context,
    endpoint: str,
    replay_endpoint: str,
    publish: Callable[[], Awaitable[int]],
) -> tuple[Frames, Frames]:
    """What a SUB received while `publish` sent its batches, then a DEALER's replay from 0."""
    sub = await subscribed(ctx, endpoint)
    try:
        live = [await recv(sub) for _ in range(await publish())]
        assert await nothing_within(sub, 0.2)
    finally:
        sub.close(linger=0)
    return live, await replay(ctx, replay_endpoint, replay_request(0))


async def subscribed(ctx: zmq.asyncio.Context, endpoint: str) -> zmq.asyncio.Socket:
    """A SUB on `endpoint` once its handshake is done and its subscription had time to land.

    vLLM's PUB cannot be probed without spending a seq: the wait is the monitor's handshake
    event plus a grace period (a PUB applies new subscriptions before its next send).
    """
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        sub.connect(endpoint)
        await asyncio.wait_for(monitor.recv_multipart(), RECV_TIMEOUT)
    finally:
        sub.disable_monitor()
        monitor.close(linger=0)
    await asyncio.sleep(0.3)
    return sub


def masked(message: list[bytes]) -> list[bytes]:
    """The message with its payload's ts zeroed (an end marker's empty payload as is)."""
    payload = message[-1]
    if not payload:
        return message
    assert payload[:2] == b"\x93\xcb", "[ts, events, rank] with a float64 ts first"
    return [*message[:-1], payload[: TS.start] + bytes(8) + payload[TS.stop :]]


def decoded(message: list[bytes]) -> list[Any]:
    """The message with its payload decoded as plain msgpack (readable diffs)."""
    return [*message[:-1], msgspec.msgpack.decode(masked(message)[-1]) if message[-1] else b""]
