"""The compiled index core (setup.py, `make native`): what runs is what was tested."""

from __future__ import annotations

import os
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from kvsi.version import core_build
from tests.conftest import stale_native_modules


def test_the_suite_runs_the_native_core() -> None:
    assert core_build() == "native", "`make test` compiles it first (`make native`)"


def test_a_source_newer_than_its_build_is_named(tmp_path: Path) -> None:
    pkg = tmp_path / "store"
    pkg.mkdir()
    for name in ("core", "memory"):
        (pkg / f"{name}.py").write_text("")
        (pkg / f"{name}{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    os.utime(pkg / "core.py", (2_000_000_000, 2_000_000_000))  # edited after the build
    os.utime(pkg / "memory.py", (1_000_000_000, 1_000_000_000))
    assert stale_native_modules(tmp_path) == ["store/core.py"]
