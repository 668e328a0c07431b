"""Runs a shipped `kvsi` command line through the real CLI, stopping where it would start
the service: what the service would have been configured with, or why it was refused."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import pytest
from typer.testing import CliRunner

import kvsi.cli
import kvsi.serve
import kvsi.simulator.fleet
from kvsi.settings import Settings


@dataclass
class Parsed:
    """What a command line would have run: serve's Settings, or simulate's arguments."""

    command: str
    settings: Settings | None = None
    simulate: dict[str, Any] | None = None


def run_kvsi(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Parsed:
    """`kvsi ARGV` with exactly `env` as its KVSI_* environment; fails on a CLI or settings
    error (an unknown option, a bad value, an unknown KVSI_ variable)."""
    for name in [n for n in os.environ if n.startswith("KVSI_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    parsed = Parsed(command=argv[0])

    async def fake_service(settings: Settings, **_: object) -> None:
        parsed.settings = settings

    async def fake_simulate(*args: object, **kwargs: Any) -> None:
        names = ("pods", "base_port", "rate", "sessions", "seed", "duration")
        parsed.simulate = dict(zip(names, args, strict=False)) | kwargs

    monkeypatch.setattr(kvsi.serve, "run_service", fake_service)
    monkeypatch.setattr(kvsi.simulator.fleet, "simulate", fake_simulate)
    monkeypatch.setattr(kvsi.cli, "configure_logging", lambda *_: None)

    def run(main: Coroutine[Any, Any, None], loop_factory: object = None) -> None:
        asyncio.run(main)  # whatever loop the settings name: the fakes above need none

    monkeypatch.setattr(kvsi.cli, "run_until_signalled", run)
    result = CliRunner().invoke(kvsi.cli.app, argv)
    assert result.exit_code == 0, f"kvsi {' '.join(argv)}: {result.output}{result.exception!r}"
    assert parsed.settings is not None or parsed.simulate is not None, argv
    return parsed
