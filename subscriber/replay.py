"""Replay client: asks a worker's replay ROUTER for its buffered batches, bounded and timed.

Imports zmq, framing and metrics; never the store or the API. One fresh DEALER per attempt,
so a late reply to an abandoned attempt can never be read as part of the next one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
import zmq
import zmq.asyncio

from kvsi.subscriber import metrics
from kvsi.subscriber.drops import DropReason
from kvsi.subscriber.framing import ReplayEnd, parse_reply, replay_request
from kvsi.subscriber.sockets import socket_failure, waiting_message
from kvsi.subscriber.turns import Turns

log = structlog.get_logger(__name__)

YIELD_EVERY = 64
"""Replies read without waiting between two turns given back to the event loop: a long
replay whose batches are already here must not hold the other streams and the API (the
process's turns, turns.py, decide whether it goes on in the next turn or waits its own)."""

QUIET_SECONDS = 0.25
"""Silence after a reply, with no end marker yet, that ends an attempt (the next asks again
from after the last reply). A publisher sends its whole buffer back to back, then the end
marker (vLLM's `_service_replay`), so once replies flow a silence is the marker lost at its
ROUTER's high-water mark (releases whose mark is below the buffer; 0.33's fits it), not a
slow engine: the stream goes on at once instead of waiting out the reply timeout. Before
the first reply the timeout holds (an engine may be slow to answer)."""

_clock = time.perf_counter

Deliver = Callable[[int, bytes], Awaitable[bool]]
"""Takes one replayed batch (seq, payload) in seq order; False stops the replay early."""


@dataclass(slots=True)
class ReplayReport:
    """What one replay fetched, over all its attempts."""

    start: int
    """The seq asked for first."""
    first_seq: int | None = None
    """The first seq the publisher returned; above `start` when its buffer no longer reaches."""
    last_seq: int | None = None
    batches: int = 0
    attempts: int = 0
    seconds: float = 0.0
    stopped: bool = False
    """The receiver stopped it early (it learned the replay would not help)."""


class ReplayFailedError(Exception):
    """Every attempt failed; `reason` is a stable label, the message says what happened."""

    def __init__(self, reason: str, message: str, report: ReplayReport) -> None:
        super().__init__(message)
        self.reason = reason
        self.report = report


class _AttemptFailedError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ReplayClient:
    """Fetches `[seq >= start]` from one replay endpoint, in either reply framing.

    Bounds: each reply must arrive within `timeout` seconds; a failed attempt (timeout, a
    hole in the reply, a socket error) is retried from the seq after the last one delivered,
    until `attempts` in a row delivered nothing: a publisher's ROUTER drops replies at its
    high-water mark whenever it sends faster than the store applies (a busy engine's
    buffer into Redis), and each such attempt still moves the replay on. `limit` is shared
    by every stream of a process, so a fleet reconnecting at once does not flood its engines
    with replays.
    """

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoint: str,
        *,
        timeout: float,
        attempts: int,
        limit: asyncio.Semaphore,
        on_drop: Callable[[DropReason], None],
        turns: Turns | None = None,
    ) -> None:
        """`turns`: when the process's streams apply (None: at once)."""
        if attempts < 1:
            raise ValueError(f"replay attempts must be >= 1, got {attempts}")
        self.endpoint = endpoint
        self._ctx = ctx
        self._timeout = timeout
        self._attempts = attempts
        self._turns = turns or Turns(None)
        self._limit = limit
        self._on_drop = on_drop

    async def fetch(self, start: int, deliver: Deliver) -> ReplayReport:
        """Deliver every buffered batch from `start` on, until the end marker.

        Raises ReplayFailedError once `attempts` attempts in a row delivered nothing;
        batches delivered before that stay delivered (a retry resumes after them). A socket
        that cannot be opened (a resource limit) is not an attempt: sockets.ResourceError,
        for the caller to wait out.
        """
        report = ReplayReport(start=start)
        began = time.perf_counter()
        fruitless = 0
        try:
            while True:
                report.attempts += 1
                delivered = report.batches
                try:
                    async with self._limit:
                        await self._attempt(report, deliver)
                    return report
                except _AttemptFailedError as exc:
                    fruitless = 0 if report.batches > delivered else fruitless + 1
                    log.warning(
                        "replay.attempt_failed",
                        endpoint=self.endpoint,
                        start=start,
                        attempt=report.attempts,
                        delivered=report.batches - delivered,
                        reason=exc.reason,
                        error=str(exc),
                    )
                    if fruitless >= self._attempts:
                        raise ReplayFailedError(
                            exc.reason,
                            f"replay from seq {start} at {self.endpoint} failed after "
                            f"{report.attempts} attempts ({fruitless} delivering nothing): "
                            f"{exc}",
                            report,
                        ) from exc
        finally:
            report.seconds = time.perf_counter() - began
            metrics.REPLAY_SECONDS.observe(report.seconds)

    async def _turn(self, since: float) -> float:
        """The time this replay spent since `since`, then a turn of the loop given back: the
        next one, or this replay's among those waiting (turns.py). Returns when it goes on."""
        turns = self._turns
        turns.spend(_clock() - since)
        if turns.open():
            await asyncio.sleep(0)
        else:
            await turns.wait()
        return _clock()

    async def _attempt(self, report: ReplayReport, deliver: Deliver) -> None:
        expected = report.start if report.last_seq is None else report.last_seq + 1
        try:
            sock = self._ctx.socket(zmq.DEALER)
        except zmq.ZMQError as exc:
            raise socket_failure(exc, f"a ZMQ socket to replay from {self.endpoint}") from exc
        sock.setsockopt(zmq.LINGER, 0)
        # A ROUTER drops (never blocks) at its high-water mark: a bounded pipe here would
        # lose replies whenever applying is slower than the network. The publisher's replay
        # buffer (vLLM's buffer_steps) bounds what one request can return.
        sock.setsockopt(zmq.RCVHWM, 0)
        # Replies already here are read on a plain shadow of the socket (no Future, no timer
        # each); only when none is waiting does the read wait, timed.
        plain: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)
        try:
            sock.connect(self.endpoint)
            await sock.send_multipart(replay_request(expected))
            first = True
            unyielded = 0
            since = _clock()
            while True:
                frames = waiting_message(plain)
                if frames is not None:
                    unyielded += 1
                    if unyielded >= YIELD_EVERY:
                        unyielded = 0
                        since = await self._turn(since)
                else:
                    unyielded = 0
                    self._turns.spend(_clock() - since)
                    wait = self._timeout if first else min(self._timeout, QUIET_SECONDS)
                    try:
                        async with asyncio.timeout(wait):
                            frames = await sock.recv_multipart()
                    except TimeoutError:
                        raise _AttemptFailedError(
                            "timeout" if first else "quiet",
                            f"no reply within {wait:g}s after seq {expected - 1}",
                        ) from None
                    if not self._turns.open():
                        await self._turns.wait()
                    since = _clock()
                parsed = parse_reply(frames)
                if isinstance(parsed, ReplayEnd):
                    return
                if isinstance(parsed, DropReason):
                    self._on_drop(parsed)
                    continue
                seq, payload = parsed
                # Only the first reply may start late (the buffer no longer reaches back:
                # the receiver decides what that costs); a later jump is a reply lost here.
                if seq < expected or (seq > expected and not first):
                    raise _AttemptFailedError("hole", f"expected seq {expected}, got {seq}")
                if report.first_seq is None:
                    report.first_seq = seq
                first = False
                report.batches += 1
                report.last_seq = seq
                expected = seq + 1
                if not await deliver(seq, payload):
                    report.stopped = True
                    return
        except zmq.ZMQError as exc:
            raise _AttemptFailedError("socket", f"{type(exc).__name__}: {exc}") from exc
        finally:
            sock.close(linger=0)
