"""The publisher side of the subscriber tests: a bare PUB, a scriptable replay ROUTER, payloads.

Imports zmq, msgspec and the wire types; a stream under test only ever sees its sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import msgspec
import zmq
import zmq.asyncio

from kvsi.subscriber import wire
from kvsi.subscriber.drops import DropReason
from kvsi.subscriber.stream import WorkerStream
from tests.ports import free_port
from tests.waiting import eventually

ENCODER = msgspec.msgpack.Encoder()


def tcp() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


def stored(hashes: list[int], session: str | None = "s1") -> wire.BlockStored:
    return wire.BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=None,
        token_ids=[0] * 16 * len(hashes),
        block_size=16,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        session_id=session,
    )


def removed(hashes: list[int]) -> wire.BlockRemoved:
    return wire.BlockRemoved(block_hashes=list(hashes), medium="GPU")


def payload(
    events: list[wire.KVCacheEvent], rank: int | None = 0, ts: float | None = None
) -> bytes:
    batch = wire.KVEventBatch(ts=ts or time.time(), events=events, data_parallel_rank=rank)
    return ENCODER.encode(batch)


class Publisher:
    """A bare PUB socket speaking vLLM's live framing; `sent` keeps every payload by seq."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoint: str, topic: bytes = b"kv@pod-a@m"):
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)  # never drop: a test decides what is lost
        self.sock.bind(endpoint)
        self.topic = topic
        self.seq = 0
        self.sent: dict[int, bytes] = {}

    async def send(self, body: bytes, *, seq: int | None = None, deliver: bool = True) -> int:
        """Publish `body` with the next seq (or `seq`); `deliver=False` only records it."""
        seq = self.seq if seq is None else seq
        self.seq = seq + 1
        self.sent[seq] = body
        if deliver:
            await self.sock.send_multipart([self.topic, seq.to_bytes(8, "big"), body])
        return seq

    async def probe(self, stream: WorkerStream) -> None:
        """Send probes until the stream receives one (PUB drops before the SUB subscribes).

        A probe is the topic alone (so topic filters pass it): one frame, which the stream
        counts as a FRAME_COUNT drop; the count and `messages` are reset after.
        """
        before = stream.counters.drops.get(DropReason.FRAME_COUNT, 0)

        async def received() -> bool:
            await self.sock.send_multipart([self.topic])
            await asyncio.sleep(0.02)
            return stream.counters.drops.get(DropReason.FRAME_COUNT, 0) > before

        await eventually(received)
        stream.counters.drops.pop(DropReason.FRAME_COUNT)
        stream.counters.messages = 0

    def close(self) -> None:
        self.sock.close(linger=0)


class ReplayRouter:
    """A replay ROUTER answering from `publisher.sent`, in either framing, with a delay.

    `delay` pauses before every reply batch (a slow engine); `silent` answers nothing (a dead
    one); `first` hides seqs below it (a buffer that no longer reaches back); `skips`
    leaves seqs out of the next replies, a set per reply (replies lost on the way);
    `lost_ends` leaves the end marker out of that many next replies; `junk` is sent first.
    """

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        publisher: Publisher,
        *,
        legacy: bool = False,
        delay: float = 0.0,
    ) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(endpoint)
        self.endpoint = endpoint
        self.publisher = publisher
        self.legacy = legacy
        self.delay = delay
        self.silent = False
        self.first = 0
        self.skips: list[set[int]] = []
        self.lost_ends = 0
        self.junk: list[list[bytes]] = []
        self.requests: list[int] = []
        self.active = 0
        self.most_active = 0
        self._task: asyncio.Task[None] | None = None
        self._answers: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._serve())

    async def close(self) -> None:
        tasks = [*self._answers, *([self._task] if self._task else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.sock.close(linger=0)

    async def _serve(self) -> None:
        while True:
            identity, _, start_frame = await self.sock.recv_multipart()
            start = int.from_bytes(start_frame, "big")
            self.requests.append(start)
            if not self.silent:
                task = asyncio.create_task(self._answer(identity, start))
                self._answers.add(task)
                task.add_done_callback(self._answers.discard)

    async def _answer(self, identity: bytes, start: int) -> None:
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            head = [b""] if self.legacy else [b"", self.publisher.topic]
            sent = dict(self.publisher.sent)  # the buffer as it is when the request arrives
            skip = self.skips.pop(0) if self.skips else set()
            for junk in self.junk:
                await self.sock.send_multipart([identity, *junk])
            for seq in sorted(s for s in sent if s >= max(start, self.first) and s not in skip):
                if self.delay:
                    await asyncio.sleep(self.delay)
                await self.sock.send_multipart([identity, *head, seq.to_bytes(8, "big"), sent[seq]])
            if self.lost_ends:
                self.lost_ends -= 1
                return
            end = [b"", wire.END_SEQ, b""] if self.legacy else [b"", b"", wire.END_SEQ, b""]
            await self.sock.send_multipart([identity, *end])
        finally:
            self.active -= 1


@contextlib.asynccontextmanager
async def running(stream: WorkerStream) -> AsyncIterator[asyncio.Task[None]]:
    """The stream's run() as a task, cancelled and awaited on exit."""
    task = asyncio.create_task(stream.run())
    try:
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
