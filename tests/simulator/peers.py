"""SUB and DEALER ends for the simulator tests: connect, probe, receive with a deadline.

Imports zmq and the simulator's publisher only. Named apart from conftest so tests can import it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import zmq
import zmq.asyncio

from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.store.hashtext import parse_hash
from kvsi.subscriber import wire
from tests.paths import WIRE

FRAMES = WIRE / "frames"

RECV_TIMEOUT = 3.0
"""Seconds any single receive may take before the test fails instead of hanging."""

PROBE = b"probe"


def load_frames(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FRAMES / name).read_text())
    return data


def frames_hex(frames: list[bytes]) -> list[str]:
    return [f.hex() for f in frames]


def fixture_hex(frames: list[dict[str, Any]]) -> list[str]:
    return [f["hex"] for f in frames]


def batch_from_expected(expected: dict[str, Any]) -> wire.KVEventBatch:
    """A fixture's normalized JSON batch as wire structs (hash strings back to int/bytes)."""
    events: list[wire.KVCacheEvent] = []
    for event in expected["events"]:
        fields = {k: v for k, v in event.items() if k != "type"}
        if "block_hashes" in fields:
            fields["block_hashes"] = [parse_hash(h) for h in fields["block_hashes"]]
        if fields.get("parent_block_hash") is not None:
            fields["parent_block_hash"] = parse_hash(fields["parent_block_hash"])
        if fields.get("extra_keys") is not None:
            fields["extra_keys"] = [
                None if keys is None else tuple(keys) for keys in fields["extra_keys"]
            ]
        cls = {
            "BlockStored": wire.BlockStored,
            "BlockRemoved": wire.BlockRemoved,
            "AllBlocksCleared": wire.AllBlocksCleared,
        }[event["type"]]
        events.append(cls(**fields))
    return wire.KVEventBatch(
        ts=expected["ts"], events=events, data_parallel_rank=expected["data_parallel_rank"]
    )


async def recv(sock: zmq.asyncio.Socket) -> list[bytes]:
    """The next message, or TimeoutError after RECV_TIMEOUT."""
    frames: list[bytes] = await asyncio.wait_for(sock.recv_multipart(), RECV_TIMEOUT)
    return frames


async def nothing_within(sock: zmq.asyncio.Socket, seconds: float) -> bool:
    """True if no message arrives for `seconds`."""
    return not await sock.poll(int(seconds * 1000))


async def subscribe(
    ctx: zmq.asyncio.Context, publisher: SimulatedPublisher, endpoint: str | None = None
) -> zmq.asyncio.Socket:
    """A SUB that is known to receive: PUB drops messages sent before the subscription lands."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint or publisher.endpoint)
    await wait_receiving(sub, publisher)
    return sub


async def wait_receiving(sub: zmq.asyncio.Socket, publisher: SimulatedPublisher) -> None:
    """Probe until the SUB gets a probe, then drain the extra probes."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RECV_TIMEOUT
    while loop.time() < deadline:
        await publisher.send_raw([PROBE])
        if await sub.poll(20):
            break
    else:
        raise TimeoutError("SUB never received a probe")
    while await sub.poll(50):
        assert await sub.recv_multipart() == [PROBE]


async def replay(
    ctx: zmq.asyncio.Context, endpoint: str, request: list[bytes]
) -> list[list[bytes]]:
    """Send one replay request from a fresh DEALER; every reply up to the end marker."""
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    try:
        await dealer.send_multipart(request)
        replies = []
        while True:
            frames = await recv(dealer)
            replies.append(frames)
            if wire.END_SEQ in frames[1:3] and frames[-1] == b"":
                return replies
    finally:
        dealer.close(linger=0)


def replay_request(start_seq: int) -> list[bytes]:
    return [b"", start_seq.to_bytes(8, "big")]


def seq_of(frames: list[bytes]) -> int:
    """Seq of a live message [topic, seq, payload]."""
    return int.from_bytes(frames[1], "big")
