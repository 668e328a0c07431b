"""Where the shipped files are, and the tools the deploy tests run."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from tests.paths import ROOT

DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
"""The test environment's scripts: hadolint, kubectl (the dev extra's wheels) live here."""


def tool(name: str) -> str:
    """The dev extra's copy of a tool, else the machine's; fails the test if neither exists
    (`pip install -e .[dev]` brings every one)."""
    local = BIN / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    assert found is not None, f"{name} not found: install the dev extra (pip install -e .[dev])"
    return found
