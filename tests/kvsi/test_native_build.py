"""The compiled index core (setup.py, `make native`): what runs is what was tested."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from kvsi.version import core_build
from tests.children import start_text
from tests.deploy.dockerfile import env_of, stages
from tests.native import stale_native_modules
from tests.paths import ROOT
from tests.ports import free_port


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


def interpreted_copy(into: Path) -> Path:
    """The package without its compiled modules, importable from `into`."""
    shutil.copytree(
        ROOT / "kvsi",
        into / "kvsi",
        ignore=shutil.ignore_patterns(*(f"*{s}" for s in EXTENSION_SUFFIXES), "__pycache__"),
    )
    return into


def test_the_interpreted_build_answers_as_the_native_one(tmp_path: Path) -> None:
    """`KVSI_PURE_PYTHON=1` ships the same source interpreted: after the same ingest (eviction,
    a restart, shared and sessionless blocks) both builds answer alike, to the byte."""
    interpreted_copy(tmp_path)
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


SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "kvsi", "api", "store")
SOURCES_TOO = ("subscriber", "simulator", "hashing")
"""What a wheel is built from (kvsi/ links to the other folders), copied without any build."""


def source_copy(into: Path) -> Path:
    src = into / "src"
    src.mkdir()
    built = shutil.ignore_patterns(*(f"*{s}" for s in EXTENSION_SUFFIXES), "__pycache__")
    for name in (*SOURCES, *SOURCES_TOO):
        path = ROOT / name
        if path.is_dir() and not path.is_symlink():
            shutil.copytree(path, src / name, ignore=built, symlinks=True)
        else:
            shutil.copy(path, src / name, follow_symlinks=False)
    return src


def build(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A build command with `env` added to the environment (and neither of the build's
    switches inherited)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("KVSI_")}
    return subprocess.run(
        argv, cwd=cwd, env=base | env, capture_output=True, text=True, timeout=600
    )


def build_wheel(src: Path, dist: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`pip wheel` of `src` with this virtualenv's build tools."""
    argv = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation"]
    return build([*argv, "-w", str(dist), str(src)], src, **env)


def test_without_a_compiler_the_wheel_carries_the_interpreted_core(tmp_path: Path) -> None:
    """No working C compiler (`CC=false`): the build says so in one line and the wheel holds
    the interpreted core, whole, which imports and says what it is."""
    dist = tmp_path / "dist"
    done = build_wheel(source_copy(tmp_path), dist, CC="false")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "native core did not build" in line]
    assert len(said) == 1 and "KVSI_REQUIRE_NATIVE=1" in said[0], done.stderr[-2000:]
    (wheel,) = dist.glob("kv_session_index-*.whl")
    site = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site)]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True, timeout=300)
    assert not [p for s in EXTENSION_SUFFIXES for p in (site / "kvsi").rglob(f"*{s}")]
    probe = "from kvsi.store.memory import MemoryStore; from kvsi.version import core_build; "
    shown = subprocess.run(
        [sys.executable, "-c", probe + "print(core_build())"],
        cwd=tmp_path,
        env=os.environ | {"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.stdout.strip() == "interpreted", shown.stderr


def test_an_in_place_build_without_a_compiler_leaves_no_compiled_module(tmp_path: Path) -> None:
    """`setup.py build_ext --inplace` (what an editable install runs) falling back removes
    an older build beside the sources too: Python would import it instead of them."""
    src = source_copy(tmp_path)
    stale = src / "store" / f"core{EXTENSION_SUFFIXES[0]}"
    stale.write_bytes(b"")
    argv = [sys.executable, "setup.py", "--quiet", "build_ext", "--inplace", "--force"]
    done = build(argv, src, CC="false")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "native core did not build (CompileError from 'false')" in done.stderr
    assert not stale.exists()
    assert not [p for s in EXTENSION_SUFFIXES for p in (src / "store").rglob(f"*{s}")]


def test_serve_warns_at_start_when_the_core_is_interpreted(tmp_path: Path) -> None:
    env = os.environ | {"PYTHONPATH": str(interpreted_copy(tmp_path)), "KVSI_LOG_FORMAT": "json"}
    argv = [sys.executable, "-m", "kvsi", "serve", "--no-ingest", "--port", str(free_port())]
    proc = start_text(argv, tmp_path, env)
    try:
        assert proc.stdout is not None
        events = []
        for line in proc.stdout:
            if line.startswith("{"):
                events.append(json.loads(line))
            if len(events) >= 2 and events[-2]["event"] == "serve.start":
                break  # the line after the start line
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    (start,) = [e for e in events if e["event"] == "serve.start"]
    assert start["core"] == "interpreted", events
    assert events[-1]["event"] == "serve.interpreted_core" and events[-1]["level"] == "warning"


def test_a_build_that_requires_the_native_core_fails_without_a_compiler(tmp_path: Path) -> None:
    """`KVSI_REQUIRE_NATIVE=1` (the image's build stage, `make native`) turns the fallback
    into the compiler's error."""
    done = build_wheel(
        source_copy(tmp_path), tmp_path / "dist", CC="false", KVSI_REQUIRE_NATIVE="1"
    )
    assert done.returncode != 0
    assert "native core did not build" not in done.stderr
    assert "'false'" in done.stdout + done.stderr, "the failing compiler command is shown"
    assert env_of(stages()[0]).get("KVSI_REQUIRE_NATIVE") == "1", "the image's build stage"
