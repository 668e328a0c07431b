"""The index core as C, compiled from its own typed Python by mypyc; pyproject.toml holds the
rest of the build. `KVSI_PURE_PYTHON=1` builds without it (the same code, interpreted)."""

from __future__ import annotations

import os

from setuptools import setup

NATIVE = [
    "kvsi/store/records.py",
    "kvsi/store/tokens.py",
    "kvsi/store/core.py",
    "kvsi/store/first_blocks.py",
    "kvsi/store/memory.py",
    "kvsi/store/redis/layout.py",
    "kvsi/store/redis/mirror.py",
]
"""The modules every event runs through once decoded: the index core, the memory store's
apply with its first-block directory, and the Redis writer's mirror (the mypyc group
`kvsi.store.native`). The subscriber's own modules stay interpreted: compiled, they moved
`bench/ingest_e2e.py` by less than its run-to-run spread."""


def native_modules() -> list[object]:
    if os.environ.get("KVSI_PURE_PYTHON", "") not in ("", "0"):
        return []
    from mypyc.build import mypycify

    return list(mypycify(NATIVE, group_name="kvsi.store.native", opt_level="3"))


setup(ext_modules=native_modules())
