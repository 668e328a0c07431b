"""Open-loop HTTP/1.1 load: pre-encoded requests at a constant rate, from its own process.

Run by route_latency.py (see bench/README.md); imports nothing of the project. Request i is
due at start + i/rps whatever the answers do, and its latency runs from that due time to the
last byte of its answer, so a slow server is charged for the requests it delays (no
coordinated omission). Requests go over `--connections` keep-alive connections; one that
finds them all busy waits in a queue, its wait counted in its latency.

Input (stdin): one JSON object per line, `{"kind": ..., "request": <raw HTTP/1.1 request,
latin-1>, "expect": <the answer's body starts with this, latin-1>}`, used in order and
cycled. Output (stdout): one JSON object with each kind's count, errors and p50/p99/max.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import selectors
import sys
import time
from collections import deque
from dataclasses import dataclass, field

STATUS_START = len(b"HTTP/1.1 ")
SLOW_SECONDS = 0.015
"""Answers slower than the fleet bench's p99 target are reported as `stalls`."""
STALL_GAP_SECONDS = 0.05
MAX_STALLS = 8


@dataclass(frozen=True)
class Request:
    """One pre-encoded request and how to recognise a right answer."""

    kind: str
    raw: bytes
    expect: bytes


@dataclass
class Tally:
    """One kind's outcomes."""

    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)
    """The first answer of each error reason (its start), to say what went wrong."""

    def error(self, reason: str, body: bytes = b"") -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1
        self.examples.setdefault(reason, body[:200].decode("latin-1"))


class Connection(asyncio.Protocol):
    """One keep-alive connection: sends a request, parses its answer, takes the next one."""

    def __init__(self, gen: Generator) -> None:
        self._gen = gen
        self._buf = b""
        self._transport: asyncio.Transport | None = None
        self.current: tuple[Request, float] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def send(self, request: Request, due: float) -> None:
        assert self._transport is not None
        self.current = (request, due)
        self._transport.write(request.raw)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        head_end = self._buf.find(b"\r\n\r\n")
        if head_end < 0 or self.current is None:
            return
        length = _content_length(self._buf[:head_end])
        end = head_end + 4 + length
        if len(self._buf) < end:
            return
        status = self._buf[STATUS_START : STATUS_START + 3]
        body = self._buf[head_end + 4 : end]
        self._buf = self._buf[end:]
        request, due = self.current
        self.current = None
        self._gen.answered(self, request, due, status, body)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._gen.lost(self)


def _content_length(head: bytes) -> int:
    """The answer's Content-Length (the app always sends one; no chunked answers here)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class Generator:
    """Sends requests at their due times over a pool of connections and tallies answers."""

    def __init__(self, requests: list[Request]) -> None:
        self._requests = requests
        self.tallies: dict[str, Tally] = {r.kind: Tally() for r in requests}
        self._idle: deque[Connection] = deque()
        self._queue: deque[tuple[Request, float]] = deque()
        self._conns: list[Connection] = []
        self.outstanding = 0
        self.max_queued = 0
        self.send_lag: list[float] = []
        self.slow: list[tuple[float, float]] = []
        """(due time, latency) of each answer slower than `SLOW_SECONDS`."""
        self.start = 0.0
        self.done = asyncio.Event()
        self._clock = asyncio.get_running_loop().time

    async def connect(self, host: str, port: int, connections: int) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(connections):
            _, conn = await loop.create_connection(lambda: Connection(self), host, port)
            self._conns.append(conn)
            self._idle.append(conn)

    async def run(self, rps: float, total: int) -> float:
        """Send `total` requests at `rps`; returns the seconds from first due to last answer."""
        loop = asyncio.get_running_loop()
        start = self.start = loop.time() + 0.05
        for i in range(total):
            due = start + i / rps
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            self.send_lag.append(loop.time() - due)
            self.outstanding += 1
            self._dispatch(self._requests[i % len(self._requests)], due)
        if self.outstanding:
            await self.done.wait()
        return loop.time() - start

    def _dispatch(self, request: Request, due: float) -> None:
        if self._idle:
            self._idle.popleft().send(request, due)
        else:
            self._queue.append((request, due))
            self.max_queued = max(self.max_queued, len(self._queue))

    def answered(
        self, conn: Connection, request: Request, due: float, status: bytes, body: bytes
    ) -> None:
        tally = self.tallies[request.kind]
        latency = self._clock() - due
        tally.latencies.append(latency)
        if latency > SLOW_SECONDS:
            self.slow.append((due, latency))
        if status != b"200":
            tally.error(f"status {status.decode()}", body)
        elif not body.startswith(request.expect):
            tally.error("unexpected body", body)
        self._finished()
        if self._queue:
            conn.send(*self._queue.popleft())
        else:
            self._idle.append(conn)

    def lost(self, conn: Connection) -> None:
        if conn.current is not None:
            self.tallies[conn.current[0].kind].error("connection lost")
            self._finished()
        if conn in self._idle:
            self._idle.remove(conn)

    def fail_outstanding(self) -> None:
        """Count requests still unanswered (queued or in flight) as timed out."""
        for request, _ in self._queue:
            self.tallies[request.kind].error("timeout")
        for conn in self._conns:
            if conn.current is not None:
                self.tallies[conn.current[0].kind].error("timeout")

    def _finished(self) -> None:
        self.outstanding -= 1
        if not self.outstanding:
            self.done.set()


def stalls(slow: list[tuple[float, float]], start: float) -> list[dict[str, float]]:
    """The slow answers as bursts: those due within `STALL_GAP_SECONDS` of the last one make
    one burst (a pause of the service, or of this machine), with when it started (seconds
    into the run), how many answers it delayed and the longest wait. The longest first."""
    bursts: list[dict[str, float]] = []
    for due, latency in sorted(slow):
        last = bursts[-1] if bursts else None
        if last is not None and due - last["last_due"] <= STALL_GAP_SECONDS:
            last["answers"] += 1
            last["max_ms"] = max(last["max_ms"], latency * 1000)
            last["last_due"] = due
        else:
            bursts.append(
                {"at_s": due - start, "answers": 1, "max_ms": latency * 1000, "last_due": due}
            )
    for burst in bursts:
        del burst["last_due"]
    return sorted(bursts, key=lambda b: -b["max_ms"])[:MAX_STALLS]


def quantile(sorted_values: list[float], q: float) -> float:
    """The q-quantile by nearest rank (no interpolation past the largest sample)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(q * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def summary(tally: Tally) -> dict[str, object]:
    values = sorted(tally.latencies)
    return {
        "answered": len(values),
        "errors": tally.errors,
        "error_examples": tally.examples,
        "p50_ms": quantile(values, 0.50) * 1000,
        "p99_ms": quantile(values, 0.99) * 1000,
        "max_ms": (values[-1] if values else float("nan")) * 1000,
    }


async def main_async(args: argparse.Namespace, requests: list[Request]) -> dict[str, object]:
    gen = Generator(requests)
    await gen.connect(args.host, args.port, args.connections)
    total = int(args.rps * args.duration)
    cpu = time.process_time()
    try:
        seconds = await asyncio.wait_for(gen.run(args.rps, total), args.duration + args.timeout)
    except TimeoutError:
        gen.fail_outstanding()
        seconds = args.duration + args.timeout
    cpu = time.process_time() - cpu
    lag = sorted(gen.send_lag)
    answered = sum(len(t.latencies) for t in gen.tallies.values())
    return {
        "sent": len(lag),
        "seconds": seconds,
        "achieved_rps": answered / seconds,
        "send_lag_p99_ms": quantile(lag, 0.99) * 1000,
        "max_queued": gen.max_queued,
        "cpu_seconds": cpu,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "kinds": {kind: summary(t) for kind, t in gen.tallies.items()},
        "stalls": stalls(gen.slow, gen.start),
    }


def read_requests() -> list[Request]:
    out = []
    for line in sys.stdin:
        item = json.loads(line)
        out.append(
            Request(
                item["kind"], item["request"].encode("latin-1"), item["expect"].encode("latin-1")
            )
        )
    if not out:
        raise SystemExit("loadgen: no requests on stdin")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rps", type=float, required=True)
    parser.add_argument("--duration", type=float, required=True, help="seconds of sending")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--timeout", type=float, default=10, help="seconds to wait for answers after the last send"
    )
    args = parser.parse_args()
    requests = read_requests()
    # select(2) takes a timeout in microseconds; epoll's is in milliseconds, which would send
    # requests up to 1 ms late and charge that to the server.
    loop = asyncio.SelectorEventLoop(selectors.SelectSelector())
    try:
        report = loop.run_until_complete(main_async(args, requests))
    finally:
        loop.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
