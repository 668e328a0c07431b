"""A whole replay buffer read slowly: vLLM 0.33's own publisher, and the simulator that stands
in for it, lose neither a reply nor the end marker.

vLLM 0.33 sets its replay ROUTER's send high-water mark to twice `buffer_steps` plus the
marker (`ZmqEventPublisher.__init__`, `_replay_hwm`, vllm/distributed/kv_events.py); a
ROUTER drops what finds its mark full, and zmq's default mark (1,000) dropped replies and
markers whenever the subscriber read slower than the publisher sent. Here a DEALER that
takes one message into its queue and waits lets the replies back up through both TCP
buffers into the ROUTER's queue; the simulator (`kvsi.simulator.publisher`) must do as
vLLM does, since the benches and demos measure replays against it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import zmq
import zmq.asyncio

from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.subscriber.framing import ReplayEnd, parse_reply, replay_request
from kvsi.subscriber.wire import BlockStored as OurBlockStored
from tests.interop.engines import (  # vLLM's own classes, once engines.py found vLLM
    BlockStored,
    EventPublisherFactory,
    KVEventBatch,
    ZmqEventPublisher,
    dialled,
    kv_events_config,
    topic,
    wait_bindable,
)
from tests.ports import free_port

pytestmark = [pytest.mark.interop]

BATCHES = 5_000
"""Batches buffered, each with BLOCKS blocks' token ids: far more bytes than loopback's TCP
buffers hold, so the rest waits in the ROUTER's queue."""
BLOCKS = 128
BLOCK_SIZE = 16
BACKED_UP = 1.0
"""Seconds the DEALER reads nothing after asking: the replies back up meanwhile."""
QUIET = 5.0
"""Seconds without a message that say the replay ended without its marker."""


def _hashes(seq: int) -> list[int]:
    return [seq * BLOCKS + i + 1 for i in range(BLOCKS)]


TOKENS = list(range(40_000, 40_000 + BLOCKS * BLOCK_SIZE))


async def _vllm_replay() -> AsyncIterator[str]:
    pub_port, replay_port = free_port(), free_port()
    config = kv_events_config("pod-a", pub_port, replay_port)
    wait_bindable(pub_port, replay_port)
    publisher = EventPublisherFactory.create(config, 0)
    assert isinstance(publisher, ZmqEventPublisher)
    try:
        for seq in range(BATCHES):
            stored = BlockStored(
                block_hashes=_hashes(seq),
                parent_block_hash=None,
                token_ids=TOKENS,
                block_size=BLOCK_SIZE,
                lora_id=None,
                medium="GPU",
                lora_name=None,
            )
            publisher.publish(KVEventBatch(ts=time.time(), events=[stored]))
        deadline = time.monotonic() + 60
        while publisher._event_queue.unfinished_tasks:  # every batch sent and buffered
            assert time.monotonic() < deadline, "vLLM's publisher thread did not send in 60 s"
            await asyncio.sleep(0.05)
        assert config.replay_endpoint is not None
        yield dialled(config.replay_endpoint, 0)
    finally:
        publisher.shutdown()


async def _simulated_replay() -> AsyncIterator[str]:
    async with SimulatedPublisher(
        "tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", topic=topic("pod-a")
    ) as publisher:
        for seq in range(BATCHES):
            stored = OurBlockStored(_hashes(seq), None, TOKENS, BLOCK_SIZE, None, "GPU", None)
            await publisher.publish([stored])
        assert publisher.replay_endpoint is not None
        yield publisher.replay_endpoint


async def _read_slowly(endpoint: str) -> tuple[list[int], bool]:
    """Ask for everything, read nothing for BACKED_UP seconds, then read it all: the seqs
    that arrived, and whether the end marker did."""
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 1)
    seqs: list[int] = []
    try:
        sock.connect(endpoint)
        await sock.send_multipart(replay_request(0))
        await asyncio.sleep(BACKED_UP)
        while True:
            try:
                frames = await asyncio.wait_for(sock.recv_multipart(), QUIET)
            except TimeoutError:
                return seqs, False
            reply = parse_reply(frames)
            if isinstance(reply, ReplayEnd):
                return seqs, True
            assert isinstance(reply, tuple), f"an unexpected reply: {reply!r}"
            seqs.append(reply[0])
    finally:
        sock.close(linger=0)
        ctx.term()


@pytest.mark.parametrize("source", ["vllm", "simulator"])
async def test_a_whole_buffer_read_slowly_arrives_with_its_end_marker(source: str) -> None:
    replays = _vllm_replay() if source == "vllm" else _simulated_replay()
    endpoint = await anext(replays)
    try:
        seqs, ended = await _read_slowly(endpoint)
    finally:
        await replays.aclose()
    assert seqs == list(range(BATCHES)), f"{BATCHES - len(seqs)} replies lost"
    assert ended, "the end marker lost"
