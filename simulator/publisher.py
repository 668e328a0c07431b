"""A vLLM 0.33 KV-event publisher: PUB live stream, ROUTER replay, with fault injection.

Imports zmq, msgspec and the wire types only; nothing from store/ or api/, and no engine:
it frames and buffers batches, whoever made them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from types import TracebackType

import msgspec
import structlog
import zmq
import zmq.asyncio

from kvsi.subscriber.wire import END_SEQ, KVCacheEvent, KVEventBatch

log = structlog.stdlib.get_logger(__name__)

DEFAULT_BUFFER_STEPS = 10_000
"""vLLM's KVEventsConfig.buffer_steps default: batches kept for replay."""

DEFAULT_HWM = 100_000
"""vLLM's KVEventsConfig.hwm default: PUB send high-water mark (messages beyond are dropped)."""


def replay_hwm(buffer_steps: int) -> int:
    """The replay ROUTER's send high-water mark, as vLLM 0.33's ZmqEventPublisher sets it:
    twice the buffer and its end marker, so a whole replay fits however slowly it is read
    (a ROUTER drops at its mark; zmq's default of 1,000 lost replies and end markers)."""
    return 2 * (buffer_steps + 1)


BIND_TIMEOUT = 5.0
"""Seconds to retry a bind on EADDRINUSE: a just-closed socket frees its port asynchronously."""


def default_topic(pod: str, model: str) -> str:
    """The topic this project's deployments configure: `kv@<pod>@<model>`."""
    return f"kv@{pod}@{model}"


def seq_bytes(seq: int) -> bytes:
    """A seq frame: 8 bytes big-endian unsigned, as vLLM sends it."""
    return seq.to_bytes(8, "big")


class SimulatedPublisher:
    """One worker's event publisher with vLLM 0.33's framing and replay protocol.

    Live: `[topic, seq, payload]` on PUB, seq counting from 0. Replay: the ROUTER answers
    `[identity, "", start_seq]` with `[identity, "", topic, seq, payload]` for each buffered
    seq >= start_seq, then `[identity, "", "", ff*8, ""]`; other frame counts are ignored.
    `legacy_replay_framing` gives the pre-0.26 replies instead (no topic frame).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        pod: str = "pod-a",
        model: str = "model",
        topic: str | None = None,
        data_parallel_rank: int | None = 0,
        buffer_steps: int = DEFAULT_BUFFER_STEPS,
        hwm: int = DEFAULT_HWM,
        legacy_replay_framing: bool = False,
        context: zmq.asyncio.Context | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Nothing is bound until `start()`; endpoints may use port `*` (see `endpoint`)."""
        if buffer_steps < 1:
            raise ValueError(f"buffer_steps must be >= 1, got {buffer_steps}")
        self._requested_endpoint = endpoint
        self._requested_replay_endpoint = replay_endpoint
        self.topic = default_topic(pod, model) if topic is None else topic
        self._topic = self.topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self.legacy_replay_framing = legacy_replay_framing
        self._hwm = hwm
        self._ctx = context if context is not None else zmq.asyncio.Context.instance()
        self._clock = clock
        self._encoder = msgspec.msgpack.Encoder()
        # Bounded like vLLM's: a subscriber further behind than this cannot be repaired.
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._drop = 0
        self._pub: zmq.asyncio.Socket | None = None
        self._router: zmq.asyncio.Socket | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self._endpoint: str | None = None
        self._replay_endpoint: str | None = None
        self.replays_served = 0
        self.replay_requests_ignored = 0

    @property
    def endpoint(self) -> str:
        """The bound PUB endpoint, with the real port if `*` was asked (valid after start)."""
        if self._endpoint is None:
            raise RuntimeError("publisher not started")
        return self._endpoint

    @property
    def replay_endpoint(self) -> str | None:
        """The bound ROUTER endpoint, or None without replay (valid after start)."""
        if self._pub is None:
            raise RuntimeError("publisher not started")
        return self._replay_endpoint

    @property
    def next_seq(self) -> int:
        """The seq the next published batch gets."""
        return self._seq

    @property
    def buffered_seqs(self) -> list[int]:
        """Seqs a replay can still return, oldest first."""
        return [seq for seq, _ in self._buffer]

    async def start(self, *, bind_timeout: float = BIND_TIMEOUT) -> None:
        """Bind PUB (and ROUTER) and serve replays; retries a busy port up to `bind_timeout`."""
        if self._pub is not None:
            raise RuntimeError("publisher already started")
        pub = self._ctx.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.setsockopt(zmq.SNDHWM, self._hwm)
        router: zmq.asyncio.Socket | None = None
        try:
            self._endpoint = await _bind(pub, self._requested_endpoint, bind_timeout)
            if self._requested_replay_endpoint is not None:
                router = self._ctx.socket(zmq.ROUTER)
                router.setsockopt(zmq.LINGER, 0)
                router.setsockopt(zmq.SNDHWM, replay_hwm(self._buffer.maxlen or 0))
                self._replay_endpoint = await _bind(
                    router, self._requested_replay_endpoint, bind_timeout
                )
        except BaseException:
            pub.close(linger=0)
            if router is not None:
                router.close(linger=0)
            raise
        self._pub, self._router = pub, router
        if router is not None:
            self._replay_task = asyncio.create_task(
                self._serve_replay(router), name=f"replay {self._replay_endpoint}"
            )
        log.debug("publisher started", topic=self.topic, endpoint=self._endpoint)

    async def close(self) -> None:
        """Unbind and close both sockets at once (linger 0), like an engine that died."""
        task, self._replay_task = self._replay_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for sock in (self._pub, self._router):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._router = None

    async def __aenter__(self) -> SimulatedPublisher:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def drop_next(self, n: int) -> None:
        """Let the next `n` batches get a seq and a replay slot but never reach PUB.

        That is what a subscriber sees when the PUB high-water mark drops messages: a gap
        it can repair by replay.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self._drop += n

    def encode(self, events: Sequence[KVCacheEvent], *, ts: float | None = None) -> bytes:
        """The payload vLLM would send for `events`: msgpack of KVEventBatch."""
        batch = KVEventBatch(
            ts=self._clock() if ts is None else ts,
            events=list(events),
            data_parallel_rank=self.data_parallel_rank,
        )
        return self._encoder.encode(batch)

    async def publish(self, events: Sequence[KVCacheEvent], *, ts: float | None = None) -> int:
        """Publish one batch stamped now (or at `ts`); returns its seq."""
        return await self.publish_payload(self.encode(events, ts=ts))

    async def publish_batch(self, batch: KVEventBatch) -> int:
        """Publish a prebuilt batch as is (its own ts and rank); returns its seq."""
        return await self.publish_payload(self._encoder.encode(batch))

    async def publish_payload(self, payload: bytes) -> int:
        """Publish raw payload bytes (garbage included) with the next seq; returns the seq."""
        pub = self._require_pub()
        seq = self._seq
        self._seq += 1
        self._buffer.append((seq, payload))
        if self._drop:
            self._drop -= 1
            log.debug("batch dropped before PUB", topic=self.topic, seq=seq)
        else:
            await pub.send_multipart((self._topic, seq_bytes(seq), payload), copy=False)
        return seq

    async def send_raw(self, frames: Sequence[bytes]) -> None:
        """Send arbitrary frames on PUB, outside seq and replay buffer.

        For malformed-message tests (short frames, bad seq) and as a probe that a SUB is
        connected before the stream under test starts (PUB drops what no SUB has asked for).
        """
        await self._require_pub().send_multipart(list(frames))

    def _require_pub(self) -> zmq.asyncio.Socket:
        if self._pub is None:
            raise RuntimeError("publisher not started or closed")
        return self._pub

    def _replay_frames(self, start_seq: int) -> list[list[bytes]]:
        """Reply messages (without identity) for a request, snapshot of the buffer now."""
        head: list[bytes] = [b""] if self.legacy_replay_framing else [b"", self._topic]
        replies = [
            [*head, seq_bytes(seq), payload] for seq, payload in self._buffer if seq >= start_seq
        ]
        end: list[bytes] = (
            [b"", END_SEQ, b""] if self.legacy_replay_framing else [b"", b"", END_SEQ, b""]
        )
        replies.append(end)
        return replies

    async def _serve_replay(self, router: zmq.asyncio.Socket) -> None:
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3:
                # vLLM logs and ignores it; the requester times out.
                self.replay_requests_ignored += 1
                log.warning("replay request ignored", topic=self.topic, frames=len(frames))
                continue
            identity, _, start = frames
            start_seq = int.from_bytes(start, "big")
            # Built before the first await: publishing meanwhile must not shift the buffer.
            for reply in self._replay_frames(start_seq):
                await router.send_multipart([identity, *reply])
            self.replays_served += 1


async def _bind(sock: zmq.asyncio.Socket, endpoint: str, retry_for: float) -> str:
    """Bind, retrying EADDRINUSE for `retry_for` seconds; returns the endpoint actually bound."""
    deadline = time.monotonic() + retry_for
    while True:
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.02)
            continue
        last = sock.getsockopt(zmq.LAST_ENDPOINT)
        return last.decode() if isinstance(last, bytes) else str(last)
