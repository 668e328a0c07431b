"""The compiled index core (setup.py, `make native`): what runs is what was tested."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from kvsi.version import core_build
from tests.native import stale_native_modules
from tests.paths import ROOT


def test_the_suite_runs_the_native_core() -> None:
    assert core_build() == "native", "`make test` compiles it first (`make native`)"


def test_a_source_newer_than_its_build_is_named(tmp_path: Path) -> None:
    pkg = tmp_path / "store"
    (pkg / "redis").mkdir(parents=True)
    (tmp_path / "build").mkdir()  # setup.py's, not a package
    sources = ["__init__.py", "core.py", "memory.py", "model.py", "redis/layout.py"]
    for name in sources:
        (pkg / name).write_text("")
        os.utime(pkg / name, (1_000_000_000, 1_000_000_000))
    for name in ("core", "memory", "redis/layout"):
        (pkg / f"{name}{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    (tmp_path / "build" / f"core{EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    (tmp_path / "build" / "setup.py").write_text("")
    assert stale_native_modules(tmp_path) == []
    for edited in ("core.py", "model.py"):  # compiled, and imported by what is compiled
        os.utime(pkg / edited, (2_000_000_000, 2_000_000_000))
    assert stale_native_modules(tmp_path) == ["store/core.py", "store/model.py"]


def test_the_interpreted_build_answers_as_the_native_one(tmp_path: Path) -> None:
    """`KVSI_PURE_PYTHON=1` ships the same source interpreted: after the same ingest (eviction,
    a restart, shared and sessionless blocks) both builds answer alike, to the byte."""
    shutil.copytree(
        ROOT / "kvsi",
        tmp_path / "kvsi",
        ignore=shutil.ignore_patterns(*(f"*{s}" for s in EXTENSION_SUFFIXES), "__pycache__"),
    )
    script = str(Path(__file__).with_name("index_digest.py"))
    answers = {}
    for build, path in (("native", ROOT), ("interpreted", tmp_path)):
        env = os.environ | {"PYTHONPATH": str(path), "PYTHONHASHSEED": "0"}
        done = subprocess.run(
            [sys.executable, script], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        answers[build] = json.loads(done.stdout)
        assert answers[build].pop("build") == build
    assert answers["native"]["losses"], "the ingest evicted"
    assert answers["native"] == answers["interpreted"]
