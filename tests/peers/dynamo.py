"""Dynamo's own standalone indexer (`python -m dynamo.indexer`, ai-dynamo-runtime 1.6.1) as a
process of the peers virtualenv (`make .venv/peers/bin/.installed`), for the tests that hold
kvsi's Dynamo API to it (tests/peers, and the interop tier with vLLM's own publishers), and
the requests both answer alike (`Asker`).

Without that virtualenv the tests skip, unless CI is set: then they fail (CI must not pass
by skipping the peer). `KVSI_PEERS_PYTHON` names another interpreter that has the wheel.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvsi.hashing.dynamo import tokens_hashes
from tests.children import tied
from tests.paths import ROOT
from tests.ports import free_port
from tests.waiting import until

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
                tied([str(python), "-m", "dynamo.indexer", "--port", str(self.port), *args]),
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


def recovered(indexer: DynamoIndexer) -> Any:
    """A check for `until`: the indexer logged its recovery from a peer."""

    async def check() -> bool:
        return "recovery from peer succeeded" in indexer.output()

    return check


@dataclass(frozen=True)
class Asker:
    """The same `/query` and `/query_by_hash` requests to any indexer serving Dynamo's API,
    for one model and block size; answers in a canonical form to compare."""

    client: httpx.AsyncClient
    model: str
    block_size: int

    async def register(self, base: str, instance_id: int, dp_rank: int, endpoint: str) -> None:
        body = {
            "instance_id": instance_id,
            "dp_rank": dp_rank,
            "endpoint": endpoint,
            "model_name": self.model,
            "block_size": self.block_size,
        }
        answer = await self.client.post(f"{base}/register", json=body)
        assert answer.status_code == 201, answer.text

    async def query(self, base: str, tokens: Sequence[int]) -> dict[str, Any]:
        body = {"token_ids": list(tokens), "model_name": self.model}
        answer = await self.client.post(f"{base}/query", json=body)
        assert answer.status_code == 200, answer.text
        return canonical(answer.json())

    async def query_by_hash(self, base: str, tokens: Sequence[int]) -> dict[str, Any]:
        """Dynamo's own block hashes of `tokens` (signed, as its clients send them)."""
        hashes = tokens_hashes(list(tokens), self.block_size)
        signed = [h - 2**64 if h >= 2**63 else h for h in hashes]
        body = {"block_hashes": signed, "model_name": self.model}
        answer = await self.client.post(f"{base}/query_by_hash", json=body)
        assert answer.status_code == 200, answer.text
        return canonical(answer.json())

    async def answers(self, bases: Sequence[str], tokens: Sequence[int]) -> list[dict[str, Any]]:
        return [await self.query(base, tokens) for base in bases]

    async def agreed(self, bases: Sequence[str], tokens: Sequence[int]) -> bool:
        """Every indexer holds part of `tokens`, and all answer alike."""
        got = await self.answers(bases, tokens)
        return bool(got[0]["instances"]) and all(a == got[0] for a in got)

    async def empty(self, bases: Sequence[str], tokens: Sequence[int]) -> bool:
        return not any(a["instances"] for a in await self.answers(bases, tokens))

    async def compare(
        self, left: str, right: str, prompts: Sequence[Sequence[int]]
    ) -> tuple[list[str], int]:
        """Prompts whose answers differ (shown), and how many `/query`s matched something."""
        diffs: list[str] = []
        matched = 0
        for chunk in range(0, len(prompts), 50):
            batch = prompts[chunk : chunk + 50]
            for ask in (self.query, self.query_by_hash):
                got = await asyncio.gather(*(ask(base, p) for p in batch for base in (left, right)))
                for i, prompt in enumerate(batch):
                    a, b = got[2 * i], got[2 * i + 1]
                    matched += bool(a["instances"]) and ask == self.query
                    if a != b:
                        diffs.append(f"{ask.__name__} {len(prompt)} tokens: {a} against {b}")
        return diffs, matched


def canonical(body: dict[str, Any]) -> dict[str, Any]:
    """An answer with its maps' order dropped (Dynamo's are Rust HashMaps)."""
    return {
        "scores": {k: dict(sorted(v.items())) for k, v in sorted(body["scores"].items())},
        "frequencies": body["frequencies"],
        "instances": {
            k: v | {"dp": dict(sorted(v["dp"].items()))}
            for k, v in sorted(body["instances"].items())
        },
    }


async def answers_alike_before_and_after_recovery(
    ask: Asker, python: Path, workdir: Path, kvsi: str, dynamo: str, asked: list[list[int]]
) -> int:
    """Assert that kvsi (base `kvsi`) and Dynamo's indexer (`dynamo`) answer every prompt
    alike, and so does a fresh Dynamo indexer recovered from kvsi's `/dump` (`--peers`);
    returns how many `/query`s matched something."""
    diffs, matched = await ask.compare(kvsi, dynamo, asked)
    assert not diffs, f"{len(diffs)} differ (kvsi, Dynamo):\n" + "\n".join(diffs[:10])
    again = DynamoIndexer(python, workdir, "recovered", "--peers", kvsi)
    try:
        await again.serving(ask.client)
        await until(recovered(again), 30.0, "recovery from kvsi", context=again.output)
        diffs, _ = await ask.compare(kvsi, again.url, asked)
        assert not diffs, f"{len(diffs)} differ after recovery:\n" + "\n".join(diffs[:10])
    finally:
        again.stop()
    return matched
