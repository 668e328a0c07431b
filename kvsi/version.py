"""The package's version, read from its installed metadata: pyproject.toml's `version` is the
one place it is written (the image tag in deploy/ follows it; tests/deploy checks).

Imports the standard library only.
"""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec

DISTRIBUTION = "kv-session-index"


def package_version() -> str:
    """The installed version, or `0.0.0+unknown` in a source tree that is not installed."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "0.0.0+unknown"


def core_build() -> str:
    """`native` when the index core runs as C compiled by mypyc (setup.py), `interpreted`
    when it runs as plain Python (`KVSI_PURE_PYTHON=1` builds, a source tree never built)."""
    spec = find_spec("kvsi.store.core")
    origin = spec.origin if spec is not None else None
    return "native" if origin and origin.endswith(tuple(EXTENSION_SUFFIXES)) else "interpreted"
