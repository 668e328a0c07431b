"""The processes tests start end with the test run, even when it is killed (tests/children.py)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.children import tied
from tests.redis_servers import require
from tests.waiting import until_sync

TESTS = Path(__file__).parent

_STARTER = """
import subprocess, sys, time
child = subprocess.Popen(sys.argv[1:])
print(child.pid, flush=True)
time.sleep(60)
"""
"""A stand-in for a test run: starts the command it is given and waits, never stopping it."""


def _gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie no one has reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def _executed(pid: int) -> bool:
    """The child runs its command, no longer setpriv (which sets the signal, then executes)."""
    return Path(f"/proc/{pid}/comm").read_text().strip() != "setpriv"


def _orphan_after_kill(argv: list[str]) -> int:
    """Start `argv` from a starter process, SIGKILL the starter once the child runs the
    command (setpriv has set its signal and executed it); the child's pid."""
    starter = subprocess.Popen(
        [sys.executable, "-c", _STARTER, *argv], stdout=subprocess.PIPE, text=True
    )
    try:
        assert starter.stdout is not None
        pid = int(starter.stdout.readline())
        until_sync(lambda: _executed(pid), 10, f"pid {pid} past setpriv")
    finally:
        starter.kill()
        starter.wait(10)
    return pid


@pytest.mark.e2e
def test_a_tied_process_ends_when_the_run_that_started_it_is_killed() -> None:
    require("setpriv")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    untied = _orphan_after_kill(sleeper)
    tied_pid = _orphan_after_kill(tied(sleeper))
    try:
        until_sync(lambda: _gone(tied_pid), 10, f"tied pid {tied_pid} gone")
        time.sleep(0.5)
        # The control: the same command untied outlives the killed starter.
        assert not _gone(untied), "an untied child ended too: the test cannot tell"
    finally:
        for pid in (untied, tied_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_every_process_the_tests_start_is_tied() -> None:
    """A `subprocess.Popen` in tests/ whose command is not `tied(...)` would outlive a killed
    run (the starter above is the one exception: it stands in for the run)."""
    untied = []
    for path in sorted(TESTS.rglob("*.py")):
        text = path.read_text()
        for found in re.finditer(r"subprocess\.Popen\(\s*", text):
            if text.startswith("tied(", found.end()) or path.name == "test_children.py":
                continue
            line = text.count("\n", 0, found.start()) + 1
            untied.append(f"{path.relative_to(TESTS.parent)}:{line}")
    assert not untied, f"processes started untied: {untied}"
