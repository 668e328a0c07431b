"""The index core as C, compiled from its own typed Python by mypyc; pyproject.toml holds the
rest of the build.

`KVSI_PURE_PYTHON=1` builds without it (the same code, interpreted). Without a working C
compiler (or Python's headers) the build falls back to that too, with a warning, so that
`pip install` works anywhere Python does; `KVSI_REQUIRE_NATIVE=1` makes that an error
instead (the image and `make native` set it). `kvsi --version`, the `serve.start` log line
and `kvsi_build_info` say which core an install runs."""

from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

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

NOT_BUILT = (CCompilerError, ExecError, PlatformError, OSError)
"""What a missing or broken C toolchain raises (CompileError and LinkError are
CCompilerErrors)."""


def flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


class AllOrNone(build_ext):
    """Builds every native module or none: the group's modules import its shared library, so
    a partial build would not import. A failure leaves the interpreted core in place."""

    def build_extensions(self) -> None:
        try:
            super().build_extensions()
        except NOT_BUILT as exc:
            if flag("KVSI_REQUIRE_NATIVE"):
                raise
            for ext in self.extensions:
                built = self.get_ext_fullpath(ext.name)
                if os.path.exists(built):
                    os.remove(built)
            self.extensions = []
            print(
                f"kv-session-index: the native core did not build ({_first_line(exc)}); "
                "installing the interpreted core (same behaviour, lower ingest rate). Install "
                "a C compiler and Python's headers for it, or set KVSI_REQUIRE_NATIVE=1 to "
                "fail here.",
                file=sys.stderr,
            )


def _first_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text if len(text) <= 160 else f"{text[:160]}..."


def native_modules() -> list[object]:
    if flag("KVSI_PURE_PYTHON"):
        return []
    from mypyc.build import mypycify

    return list(mypycify(NATIVE, group_name="kvsi.store.native", opt_level="3"))


setup(ext_modules=native_modules(), cmdclass={"build_ext": AllOrNone})
