"""What a 100 MB request body costs `kvsi serve`: peak RSS and how long `/healthz` waits.

Runs `kvsi serve` (memory store, no publishers) once with the default `max_body_bytes` and
once with a limit above the body (what every body met before there was one), and posts a
100 MB JSON body (`{"token_ids": [1, 1, ...]}`) to `/v1/route`: with its Content-Length,
and chunked (no length declared). Meanwhile a thread asks `/healthz` every 10 ms. Prints,
per case, the medians over the runs of: the status, the server's peak RSS growth (VmHWM
after - VmRSS before, MB), and the slowest `/healthz` answer during the upload (ms).

    .venv/bin/python bench/big_body.py [--mb 100] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.ports import free_port_run  # noqa: E402


def status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@contextmanager
def server(limit: int | None) -> Iterator[tuple[int, int]]:
    port = free_port_run(1)
    env = os.environ | {"KVSI_LOG_LEVEL": "warning"}
    if limit is not None:
        env["KVSI_MAX_BODY_BYTES"] = str(limit)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvsi", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield proc.pid, port
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def body_chunks(megabytes: int) -> Iterator[bytes]:
    """`{"token_ids": [1,1,...,1]}` of about `megabytes` MB, in 1 MiB pieces."""
    piece = b"1," * (512 * 1024)
    yield b'{"token_ids": ['
    for _ in range(megabytes):
        yield piece
    yield b"1]}"


def post(port: int, megabytes: int, chunked: bool) -> int:
    size = sum(len(c) for c in body_chunks(megabytes))
    framing = b"Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}".encode()
    head = b"POST /v1/route HTTP/1.1\r\nHost: b\r\nConnection: close\r\n" + framing + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=120) as conn:
        conn.sendall(head)
        try:
            for chunk in body_chunks(megabytes):
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            if chunked:
                conn.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server answered and closed before the whole body was sent
        answer = b""
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except OSError:
            pass
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def slowest_health(port: int, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=30).close()
        out.append((time.perf_counter() - started) * 1000)
        time.sleep(0.01)


def one_run(limit: int | None, megabytes: int, chunked: bool) -> tuple[int, float, float]:
    with server(limit) as (pid, port):
        before = status_kb(pid, "VmRSS")
        stop = threading.Event()
        waits: list[float] = []
        prober = threading.Thread(target=slowest_health, args=(port, stop, waits))
        prober.start()
        code = post(port, megabytes, chunked)
        stop.set()
        prober.join()
        grown = (status_kb(pid, "VmHWM") - before) / 1024
    return code, grown, max(waits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"{'limit':>12} {'framing':>8} {'status':>6} {'peak RSS +MB':>12} {'healthz max ms':>14}")
    for limit, name in ((None, "default"), (10 * args.mb * 2**20, "above body")):
        for chunked in (False, True):
            runs = [one_run(limit, args.mb, chunked) for _ in range(args.runs)]
            print(
                f"{name:>12} {'chunked' if chunked else 'length':>8} "
                f"{statistics.median(r[0] for r in runs):>6.0f} "
                f"{statistics.median(r[1] for r in runs):>12.1f} "
                f"{statistics.median(r[2] for r in runs):>14.1f}"
            )


if __name__ == "__main__":
    main()
