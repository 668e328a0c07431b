"""The package's version, read from its installed metadata: pyproject.toml's `version` is the
one place it is written (the image tag in deploy/ follows it; tests/deploy checks).

Imports the standard library only.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "kv-session-index"


def package_version() -> str:
    """The installed version, or `0.0.0+unknown` in a source tree that is not installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0.0.0+unknown"
