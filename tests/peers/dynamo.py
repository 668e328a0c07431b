"""Dynamo's own standalone indexer (`python -m dynamo.indexer`, ai-dynamo-runtime 1.6.1) as a
process of the peers virtualenv (`make .venv/peers/bin/.installed`), for the tests that hold
kvsi's Dynamo API to it.

Without that virtualenv the tests skip, unless CI is set: then they fail (CI must not pass
by skipping the peer). `KVSI_PEERS_PYTHON` names another interpreter that has the wheel.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port

ROOT = Path(__file__).parents[2]
PEERS_PYTHON = Path(
    os.environ.get("KVSI_PEERS_PYTHON", ROOT / ".venv" / "peers" / "bin" / "python")
)
START_WITHIN = 30.0


def require_peer() -> Path:
    """The peers interpreter, if it imports dynamo.llm; else skip (fail when CI is set)."""
    ok = PEERS_PYTHON.exists() and (
        subprocess.run(
            [str(PEERS_PYTHON), "-c", "import dynamo.llm"], capture_output=True, timeout=60
        ).returncode
        == 0
    )
    if not ok:
        reason = f"needs ai-dynamo-runtime in {PEERS_PYTHON} (make .venv/peers/bin/.installed)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (required because CI is set)")
        pytest.skip(reason)
    return PEERS_PYTHON


class DynamoIndexer:
    """One `python -m dynamo.indexer` on a free loopback port, logging to `log`."""

    def __init__(self, python: Path, workdir: Path, name: str, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"{name}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(python), "-m", "dynamo.indexer", "--port", str(self.port), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
                | {"NO_COLOR": "1", "RUST_LOG": "info"},
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def serving(self, client: httpx.AsyncClient) -> None:
        deadline = time.monotonic() + START_WITHIN
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"dynamo.indexer exited\n{self.output()[-3000:]}")
            try:
                if (await client.get(f"{self.url}/health")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
        raise AssertionError(f"dynamo.indexer not serving\n{self.output()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
