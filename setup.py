"""The index core as C, compiled from its own typed Python by mypyc; pyproject.toml holds the
rest of the build.

`KVSI_PURE_PYTHON=1` builds without it (the same code, interpreted). Without a working C
compiler (or Python's headers) the build falls back to that too, with a warning in the
build's output (`pip install -v` shows it), so that installing this project needs no
compiler; `KVSI_REQUIRE_NATIVE=1` makes that an error instead (the image and `make native`
set it). `kvsi --version`, `kvsi_build_info{core}` and a warning at `kvsi serve`'s start
say when an install runs the interpreted core."""

from __future__ import annotations

import os
import sys
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

NATIVE = [
    "kvsi/store/records.py",
    "kvsi/store/tokens.py",
    "kvsi/store/core.py",
    "kvsi/store/first_blocks.py",
    "kvsi/store/directory.py",
    "kvsi/store/memory.py",
    "kvsi/store/redis/layout.py",
    "kvsi/store/redis/plan.py",
    "kvsi/store/redis/resp.py",
    "kvsi/store/redis/mirror.py",
]
"""The modules every event runs through once decoded: the index core, the memory store's
apply with its first-block directory, and the Redis writer's mirror and plan with the
directory rules it checks each run against (the mypyc group `kvsi.store.native`). The
subscriber's own modules stay interpreted: compiled, they moved `bench/ingest_e2e.py` by
less than its run-to-run spread."""

NOT_BUILT = (CCompilerError, ExecError, PlatformError)
"""What a missing or broken C toolchain raises (CompileError and LinkError are
CCompilerErrors; a compiler that cannot be run is an ExecError turned CompileError)."""


def flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


class AllOrNone(build_ext):  # type: ignore[misc]
    """Builds every native module or none: the group's modules import its shared library, so
    a partial build would not import. A failure leaves the interpreted core in place, in the
    build and, for an in-place or editable build, in the source tree too."""

    def run(self) -> None:
        in_place = [self._in_place(ext) for ext in self.extensions] if self.inplace else []
        try:
            super().run()
        except BaseException:
            _remove(in_place)  # a copy into the tree that failed half-way
            raise
        if self.extensions == [] and in_place:
            _remove(in_place)  # fell back: no older build may stay beside the sources

    def build_extensions(self) -> None:
        try:
            super().build_extensions()
        except NOT_BUILT as exc:
            if flag("KVSI_REQUIRE_NATIVE"):
                raise
            _remove([self.get_ext_fullpath(ext.name) for ext in self.extensions])
            self.extensions = []
            compiler = getattr(self.compiler, "compiler_so", None) or ["the C compiler"]
            print(
                f"kv-session-index: the native core did not build ({type(exc).__name__} from "
                f"{compiler[0]!r}); installing the interpreted core (same behaviour, lower "
                "ingest rate). Install a C compiler and Python's headers, then reinstall "
                "with `pip install --no-cache-dir` (pip keeps this build), or set "
                "KVSI_REQUIRE_NATIVE=1 to fail here.",
                file=sys.stderr,
            )

    def _in_place(self, ext: Any) -> str:
        """Where an in-place build puts `ext` (setuptools builds in build/, then copies)."""
        was, self.inplace = self.inplace, True
        try:
            return str(self.get_ext_fullpath(ext.name))
        finally:
            self.inplace = was


def _remove(paths: list[str]) -> None:
    for path in paths:
        if os.path.exists(path):
            os.remove(path)


def native_modules() -> list[object]:
    if flag("KVSI_PURE_PYTHON"):
        if flag("KVSI_REQUIRE_NATIVE"):
            raise SystemExit("kv-session-index: KVSI_PURE_PYTHON and KVSI_REQUIRE_NATIVE both set")
        return []
    from mypyc.build import mypycify

    return list(mypycify(NATIVE, group_name="kvsi.store.native", opt_level="3"))


setup(ext_modules=native_modules(), cmdclass={"build_ext": AllOrNone})
