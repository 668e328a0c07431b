"""A real `kvsi serve --demo` process and a headless Chromium driven by Playwright.

Chromium is Debian's (`/usr/bin/chromium`, installed by .ci/run), never Playwright's own
download; without it (or without Playwright) the tests skip, and fail when CI is set.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

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
