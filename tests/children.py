"""Processes the tests start, tied to the test run: they end when it ends, however it ends.

A test stops what it started in a `finally` or a fixture's finalizer; a test run killed from
outside (a CI job's timeout, `kill -9`, pytest-timeout's thread method) runs neither, and its
redis-servers and `kvsi serve` processes went on for good. `tied` runs a command under
util-linux's `setpriv --pdeathsig TERM`, which asks the kernel to send it SIGTERM when the
thread that started it ends, and then executes the command in the same process (same pid:
signals and `wait` reach the command itself). Start tied processes from the thread that
outlives them (every test and fixture here runs on pytest's main thread).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

SETPRIV = shutil.which("setpriv")
"""util-linux's setpriv (essential on Debian); without it, processes are started untied."""


def tied(argv: Sequence[str]) -> list[str]:
    """`argv`, to be ended with SIGTERM when the starting thread (the test run) ends."""
    if SETPRIV is None:
        return list(argv)
    return [SETPRIV, "--pdeathsig", "TERM", "--", *argv]


def start_text(argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> subprocess.Popen[str]:
    """`argv` started tied, in `cwd` with `env`, its output and errors in one text pipe."""
    return subprocess.Popen(
        tied(argv), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
