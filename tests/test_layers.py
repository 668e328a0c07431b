"""The layers import one way: store/ neither zmq, fastapi nor the layers above it;
subscriber/ never the API or the wiring; api/ never zmq or the subscriber. Checked in a
fresh interpreter that imports every module of the layer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.paths import ROOT

WIRING = ("kvsi.cli", "kvsi.serve", "kvsi.settings", "kvsi.discovery", "kvsi.janitor")
FORBIDDEN = {
    "store": ("zmq", "fastapi", "starlette", "uvicorn", "kvsi.subscriber", "kvsi.api", *WIRING),
    "subscriber": ("fastapi", "starlette", "uvicorn", "kvsi.api", *WIRING),
    "api": ("zmq", "kvsi.subscriber", *WIRING),
    "hashing": ("zmq", "fastapi", "kvsi.store", "kvsi.subscriber", "kvsi.api", *WIRING),
}
"""Modules each layer must not load, directly or through another module (a name and
everything below it)."""

BARE = ("api", "store", "subscriber", "simulator", "hashing")
"""The folders' own names: the package ships them as kvsi.*, so nothing may import them bare
(two module objects for one file)."""


def modules_of(package: str) -> list[str]:
    return sorted(
        "kvsi." + ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for path in (ROOT / package).rglob("*.py")
    )


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_layer_loads_nothing_above_it(package: str) -> None:
    modules = modules_of(package)
    probe = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if any(m == f or m.startswith(f + '.') "
        f"for f in {(*FORBIDDEN[package], *BARE)!r}))\n"
        "print('\\n'.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert len(modules) > 1, "the layer's modules were not found"
    assert result.stdout.strip() == "", f"{package} loads {result.stdout.split()}"


def test_the_service_imports_only_the_kvsi_name() -> None:
    probe = (
        "import sys, kvsi.cli, kvsi.serve, kvsi.discovery, kvsi.tail, kvsi.simulator.fleet\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {BARE!r}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout
