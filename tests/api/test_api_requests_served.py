"""`kvsi serve` as a real process on a real socket: a body over the limit is a 413 before it
is sent whole, a `curl -d` body is read, and each request is one escaped, bounded log line."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.children import tied
from tests.environ import service_environ
from tests.ports import free_port_run
from tests.waiting import until_sync

pytestmark = pytest.mark.e2e

LIMIT = 1_048_576


@dataclass(frozen=True)
class Served:
    base: str
    port: int
    log: Path

    def log_lines(self, until: str, within: float = 10.0) -> list[bytes]:
        """The log's lines once one holds `until` (bounded wait: the line is written after
        the response is sent)."""

        def written() -> list[bytes] | None:
            lines = self.log.read_bytes().split(b"\n")
            return lines if any(until.encode() in line for line in lines) else None

        try:
            return until_sync(written, within, f"a log line with {until!r}")
        except AssertionError:
            return self.log.read_bytes().split(b"\n")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    port = free_port_run(1)
    log = tmp_path_factory.mktemp("served") / "kvsi.log"
    env = service_environ(
        {"KVSI_MAX_BODY_BYTES": str(LIMIT), "KVSI_LOG_FORMAT": "console", "PYTHONUNBUFFERED": "1"}
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            tied([sys.executable, "-m", "kvsi", "serve", "--port", str(port)]),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    base = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            assert proc.poll() is None, log.read_text()[-2000:]
            return status(f"{base}/healthz") == 200

        until_sync(healthy, 45, "kvsi serve answering /healthz")
        yield Served(base, port, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def status(url: str, data: bytes | None = None) -> int:
    try:
        with urllib.request.urlopen(url, data=data, timeout=5) as response:
            code: int = response.status
            return code
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def test_a_declared_body_over_the_limit_is_413_before_it_is_sent(served: Served) -> None:
    head = (
        b"POST /v1/route HTTP/1.1\r\nHost: kvsi\r\nContent-Type: application/json\r\n"
        b"Content-Length: 52428800\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        conn.sendall(head + b" " * 65_536)  # 64 KiB of the 50 MB announced, then wait
        answer = b""
        while chunk := conn.recv(65_536):  # the server answers, then closes
            answer += chunk

    status_line, _, rest = answer.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert status_line.startswith(b"HTTP/1.1 413")
    assert b"connection: close" in headers.lower()
    assert json.loads(body) == {
        "detail": f"request body is larger than {LIMIT} bytes (setting max_body_bytes)"
    }
    assert status(f"{served.base}/healthz") == 200


def test_a_curl_d_body_is_read_as_json(served: Served) -> None:
    # urllib, as curl -d, sends the body as application/x-www-form-urlencoded.
    assert status(f"{served.base}/v1/route", data=b'{"session_id": "s"}') == 200
    assert status(f"{served.base}/v1/route", data=b"session_id=s") == 400

    lines = served.log_lines(until="method=POST")
    posted = [line for line in lines if b"method=POST" in line]
    assert posted and all(b"route=/v1/route" in line for line in posted)


def test_the_request_log_escapes_control_characters_and_cuts_long_ids(served: Served) -> None:
    long_id = "a" * 60_000
    assert status(f"{served.base}/v1/sessions/%00x%1B%0Aforged") == 400
    assert status(f"{served.base}/v1/sessions/{long_id}") == 400

    lines = served.log_lines(until="60013 characters")
    raw = b"\n".join(lines)
    assert b"\x00" not in raw and b"\x1b" not in raw
    assert not any(line.startswith(b"forged") for line in lines)
    [escaped] = [line for line in lines if b"x\\x1b\\nforged" in line]
    assert escaped.count(b"\\x00x\\x1b\\nforged") == 2  # the path and the session_id
    [cut] = [line for line in lines if b"60013 characters" in line]
    path = f"/v1/sessions/{long_id}"
    assert f"{path[:256]}... (60013 characters)".encode() in cut
    assert b"a" * 244 not in cut and len(cut) < 1_000  # once, cut: not as session_id too
