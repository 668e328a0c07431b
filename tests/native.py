"""Whether the in-place compiled build (`make native`) is older than the code it was built
from: Python would import the build, not the code being tested."""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

KINDS = sorted({suffix.rsplit(".", 1)[-1] for suffix in EXTENSION_SUFFIXES})
"""The compiled modules' file extensions (`so`; `pyd` on Windows): one glob each."""


def stale_native_modules(root: Path) -> list[str]:
    """Sources changed since `make native` compiled the package they are in (a top-level
    package of `root` holding compiled modules; the build has the types of the modules it
    imports built in, so every source of the package counts)."""
    built: dict[Path, float] = {}
    for kind in KINDS:
        for module in root.glob(f"[!.]*/**/*.{kind}"):
            top = root / module.relative_to(root).parts[0]
            if not (top / "__init__.py").exists():
                continue  # not a package: setup.py's build/ folder
            when = module.stat().st_mtime
            built[top] = min(built.get(top, when), when)
    return sorted(
        str(source.relative_to(root))
        for top, oldest in built.items()
        for source in top.rglob("*.py")
        if source.stat().st_mtime > oldest
    )
