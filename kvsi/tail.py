"""`kvsi tail`: print one publisher's decoded events, one readable line per event.

Imports zmq and the wire decoder; never the store or the API.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable

import zmq
import zmq.asyncio

from kvsi.errors import StartupError
from kvsi.store.endpoints import zmq_endpoint
from kvsi.store.hashtext import format_hash
from kvsi.subscriber import wire
from kvsi.subscriber.decode import wire_decoder
from kvsi.subscriber.framing import SEQ_BYTES


def describe(event: wire.KVCacheEvent) -> str:
    """One event as a line: kind, session, medium, group and hashes as the API prints them."""
    if isinstance(event, wire.AllBlocksCleared):
        return "AllBlocksCleared"
    hashes = " ".join(format_hash(h) for h in event.block_hashes)
    where = f"medium={event.medium or 'GPU'} group={event.group_idx or 0}"
    if isinstance(event, wire.BlockStored):
        return f"BlockStored session={event.session_id} {where} blocks=[{hashes}]"
    return f"BlockRemoved {where} blocks=[{hashes}]"


async def tail(
    endpoint: str,
    topic: str,
    count: int | None,
    out: Callable[[str], object] = print,
    *,
    quiet_notice: float = 10.0,
    notice: Callable[[str], object] = lambda line: print(line, file=sys.stderr),
) -> None:
    """Print events from `endpoint` until `count` messages (or forever); after every
    `quiet_notice` seconds with nothing received, say so through `notice`."""
    try:
        zmq_endpoint(endpoint)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        sock.close(linger=0)
        ctx.term()
        raise StartupError(f"cannot connect to {endpoint!r}: {exc}") from exc
    decoder = wire_decoder()
    seen = 0
    try:
        while count is None or seen < count:
            try:
                async with asyncio.timeout(quiet_notice):
                    frames = await sock.recv_multipart()
            except TimeoutError:
                notice(_quiet(endpoint, topic, quiet_notice, seen))
                continue
            seen += 1
            if len(frames) != 3 or len(frames[1]) != SEQ_BYTES:
                out(f"! malformed message: {len(frames)} frames")
                continue
            topic_text = frames[0].decode(errors="replace")
            seq = int.from_bytes(frames[1], "big")
            decoded = decoder.decode(frames[2])
            head = f"seq={seq} topic={topic_text} rank={decoded.data_parallel_rank}"
            for reason in decoded.dropped:
                out(f"{head} ! dropped: {reason.value}")
            for event in decoded.events:
                out(f"{head} {describe(event)}")
            sys.stdout.flush()
    finally:
        sock.close(linger=0)
        ctx.term()


def _quiet(endpoint: str, topic: str, seconds: float, seen: int) -> str:
    since = "since the last one" if seen else "yet"
    wanted = f" with topic prefix {topic!r}" if topic else ""
    return (
        f"(no message from {endpoint}{wanted} {since} in {seconds:g} s: is the engine "
        "publishing there, with KV events on, and does the topic match?)"
    )
