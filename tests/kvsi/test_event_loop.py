"""The `event_loop` setting, on real `kvsi serve` processes: uvloop by default, asyncio when
asked or where uvloop is not installed, named in the start line with how long a thread
beside it may hold the GIL; uvloop asked for where it is not installed is one line and exit
code 2."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from kvsi.cli import run_until_signalled
from kvsi.loops import THREAD_SWITCH_SECONDS, loop_factory, loop_name
from kvsi.simulator.fleet import SimulatedFleet
from tests.e2e.services import services
from tests.kvsi.test_cli_errors import assert_one_line, run
from tests.waiting import eventually

pytestmark = pytest.mark.e2e

NO_UVLOOP = str(Path(__file__).parent / "fixtures" / "no_uvloop")
"""A PYTHONPATH entry whose `uvloop` fails to import."""


def _without_uvloop() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [NO_UVLOOP, os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize(
    ("env", "loop"),
    [
        ({}, "uvloop"),
        ({"KVSI_EVENT_LOOP": "uvloop"}, "uvloop"),
        ({"KVSI_EVENT_LOOP": "asyncio"}, "asyncio"),
        (_without_uvloop(), "asyncio"),
    ],
    ids=["auto", "uvloop", "asyncio", "auto-without-uvloop"],
)
async def test_serve_runs_on_the_loop_it_names(env: dict[str, str], loop: str) -> None:
    """It also ingests a simulated pod and answers its session on that loop."""
    async with SimulatedFleet(pods=1, sessions=2, seed=5, num_blocks=400) as fleet:
        fleet.run_in_background(50)
        async with services() as running:
            service = running.start("kvsi", "memory", fleet, env=env)
            client = await running.client(service)

            async def some_session() -> bool:
                listed = (await client.get("/v1/sessions")).json()["sessions"]
                return (
                    bool(listed)
                    and (await client.get(f"/v1/sessions/{listed[0]['session_id']}")).status_code
                    == 200
                )

            await eventually(some_session)
            lines = [json.loads(line) for line in service.output().splitlines() if line[:1] == "{"]
    (start,) = [line for line in lines if line.get("event") == "serve.start"]
    assert start["event_loop"] == loop, start
    assert start["thread_switch_seconds"] == pytest.approx(THREAD_SWITCH_SECONDS), start


def test_uvloop_asked_for_where_it_is_not_installed_is_one_line() -> None:
    result = run(
        [sys.executable, "-m", "kvsi", "serve"], _without_uvloop() | {"KVSI_EVENT_LOOP": "uvloop"}
    )
    assert_one_line(result, "event_loop: uvloop is not installed")


@pytest.mark.parametrize("name", ["uvloop", "asyncio"])
def test_the_stop_signals_handlers_are_put_back_after_the_loop(name: str) -> None:
    """uvloop's loop leaves its own handlers when it closes, dead with it: a Ctrl-C or a
    SIGTERM during what runs after (flushing spans) would do nothing."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    ran: list[str] = []

    async def main() -> None:
        ran.append(loop_name())

    run_until_signalled(main(), loop_factory(name))
    assert ran == [name]
    assert {s: signal.getsignal(s) for s in before} == before
