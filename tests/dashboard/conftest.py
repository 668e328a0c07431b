"""A real `kvsi serve --demo` process (or one over 100 still simulated publishers holding
100,000 sessions) and a headless Chromium driven by Playwright.

Chromium is Debian's (`/usr/bin/chromium`, installed by .ci/run), never Playwright's own
download; without it (or without Playwright) the tests skip, and fail when CI is set.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.subscriber.wire import BlockStored
from tests.e2e.services import Service, keep

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

if TYPE_CHECKING:
    from playwright.async_api import Browser


def _require_browser() -> None:
    missing = []
    if importlib.util.find_spec("playwright") is None:
        missing.append("playwright (the dev extra)")
    if not Path(CHROMIUM).exists():
        missing.append(CHROMIUM)
    if missing:
        reason = f"needs {', '.join(missing)}"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (required because CI is set)")
        pytest.skip(reason)


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    _require_browser()
    from playwright.async_api import async_playwright  # only once it is known to be there

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


class Demo:
    """`kvsi serve --demo` on a loopback port; `restart` keeps the port, as a pod restart does."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = env
        self.runs: list[Service] = []
        self.url = ""

    async def start(self, port: int = 0) -> str:
        args = ["serve", "--demo", "--host", "127.0.0.1", "--port", str(port)]
        service = Service(f"demo-{len(self.runs)}", args, self.env, self.workdir)
        self.runs.append(service)
        self.url = await service.serving()
        return self.url

    def stop(self) -> None:
        self.runs[-1].stop()

    async def restart(self) -> str:
        port = int(self.url.rsplit(":", 1)[1])
        self.stop()
        return await self.start(port)

    def close(self) -> None:
        for service in self.runs:
            service.stop()
            keep(service.log, service.name)


async def _demo(env: dict[str, str]) -> AsyncIterator[Demo]:
    workdir = Path(tempfile.mkdtemp(prefix="kvsi-dashboard-"))
    demo = Demo(workdir, env)
    try:
        await demo.start()
        yield demo
    finally:
        demo.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
async def demo() -> AsyncIterator[Demo]:
    async for running in _demo({}):
        yield running


TOKEN = "dashboard-test-token"


@pytest.fixture
async def guarded_demo() -> AsyncIterator[Demo]:
    """The demo with bearer tokens configured: every /v1 call needs TOKEN."""
    async for running in _demo({"KVSI_API_TOKENS": f'["{TOKEN}"]'}):
        yield running


WORKERS = 100
SESSIONS = 100_000
BUSIEST = 12
"""Sessions sess-000000 .. sess-000011 hold 40 .. 29 blocks; every other holds 1 to 3."""
SEED_BATCH = 100
"""Sessions per published batch."""
BUILD_WITHIN = 180.0
"""Seconds `kvsi serve` gets to build the index by replay on a loaded 2-core machine."""


def session_id(i: int) -> str:
    return f"sess-{i:06d}"


def session_blocks(i: int) -> int:
    return 40 - i if i < BUSIEST else 1 + i % 3


@dataclass(frozen=True)
class BigIndex:
    """`kvsi serve` (memory store) over WORKERS simulated publishers that hold SESSIONS."""

    url: str
    blocks: int
    """Entries seeded: what the fleet view's blocks add up to."""


async def _seed(pubs: list[SimulatedPublisher]) -> int:
    """Every session's blocks into its worker's replay buffer (session i on worker i % 100),
    published before anyone subscribes: the service gets them by replay, as a late joiner."""
    total = 0
    for w, pub in enumerate(pubs):
        mine = range(w, SESSIONS, WORKERS)
        for start in range(0, len(mine), SEED_BATCH):
            events = []
            for i in mine[start : start + SEED_BATCH]:
                n = session_blocks(i)
                total += n
                events.append(
                    BlockStored(
                        block_hashes=[i * 64 + j for j in range(n)],
                        parent_block_hash=None,
                        token_ids=[],
                        block_size=16,
                        lora_id=None,
                        medium="GPU",
                        lora_name=None,
                        session_id=session_id(i),
                    )
                )
            await pub.publish(events)
    return total


async def _built(service: Service, url: str, blocks: int) -> None:
    """Wait (polling twice a second: the service is busy) until every worker is live and
    the index holds every seeded block; fail with the service's log after BUILD_WITHIN."""
    deadline = time.monotonic() + BUILD_WITHIN
    last = ""
    async with httpx.AsyncClient(base_url=url, timeout=30) as api:
        while time.monotonic() < deadline:
            pods = (await api.get("/v1/pods")).json()["pods"]
            live = sum(p["state"] == "live" for p in pods)
            held = sum(p["blocks"] for p in pods)
            if live == WORKERS and held == blocks:
                return
            last = f"{len(pods)} workers, {live} live, {held} of {blocks} blocks"
            await asyncio.sleep(0.5)
    raise AssertionError(f"index not built within {BUILD_WITHIN}s ({last})\n{service.tail()}")


@pytest.fixture
async def big_index() -> AsyncIterator[BigIndex]:
    """The scale the dashboard must stay usable at: 100 workers, 100,000 sessions. Nothing
    publishes after the seed, so what the page shows is known exactly."""
    _require_browser()
    pubs = [
        SimulatedPublisher(
            "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", pod=f"vllm-{w:03d}"
        )
        for w in range(WORKERS)
    ]
    workdir = Path(tempfile.mkdtemp(prefix="kvsi-dashboard-scale-"))
    service: Service | None = None
    try:
        for pub in pubs:
            await pub.start()
        blocks = await _seed(pubs)
        publishers = [
            {"pod": f"vllm-{w:03d}", "endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint}
            for w, p in enumerate(pubs)
        ]
        args = ["serve", "--host", "127.0.0.1", "--port", "0"]
        env = {"KVSI_PUBLISHERS": json.dumps(publishers), "KVSI_LOG_LEVEL": "warning"}
        service = Service("scale", args, env, workdir)
        url = await service.serving()
        await _built(service, url, blocks)
        yield BigIndex(url, blocks)
    finally:
        if service is not None:
            service.stop()
            keep(service.log, service.name)
        for pub in pubs:
            await pub.close()
        shutil.rmtree(workdir, ignore_errors=True)
