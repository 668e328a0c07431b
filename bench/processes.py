"""Processes a bench runs beside itself: started in a session of their own, output to a file,
stopped (terminate, then kill) when the bench is done with them."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def background(
    argv: list[str], env: dict[str, str], prefix: str, cwd: Path = REPO
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`argv` with `env` over this process's, run in `cwd`, its output in a temporary log;
    yields both.

    In a session of its own: Linux's autogroup scheduler then shares the cores between the
    bench's processes as between containers, instead of lumping them into one share against
    every other job on the machine.
    """
    log = Path(tempfile.mkstemp(prefix=prefix, suffix=".log")[1])
    with log.open("w") as sink:
        proc = subprocess.Popen(
            argv, env=os.environ | env, stdout=sink, stderr=sink, cwd=cwd,
            start_new_session=True,
        )  # fmt: skip
    try:
        yield proc, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.unlink()
