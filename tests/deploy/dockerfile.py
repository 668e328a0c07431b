"""Reads the Dockerfile's instructions, so tests run the image's own commands and settings."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

from tests.deploy.paths import ROOT


@dataclass
class Stage:
    """One FROM ... stage: its base and instructions (continuation lines joined)."""

    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for key, args in self.instructions if key == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"no {keyword} in the stage FROM {self.base}"
        return found[-1]


def stages() -> list[Stage]:
    """Every stage of the Dockerfile, in order."""
    out: list[Stage] = []
    for key, args in _instructions((ROOT / "Dockerfile").read_text()):
        if key == "FROM":
            out.append(Stage(args))
        elif out:
            out[-1].instructions.append((key, args))
    return out


def exec_form(args: str) -> list[str]:
    """A JSON-array instruction (ENTRYPOINT, CMD, HEALTHCHECK's CMD) as argv."""
    argv = json.loads(args)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv), args
    return argv


def env_of(stage: Stage) -> dict[str, str]:
    """The stage's ENV KEY=VALUE pairs (PATH left out: the test's virtualenv has its own)."""
    env: dict[str, str] = {}
    for args in stage.all("ENV"):
        for pair in shlex.split(args):
            key, _, value = pair.partition("=")
            env[key] = value
    env.pop("PATH", None)
    return env


def _instructions(text: str) -> list[tuple[str, str]]:
    lines: list[str] = []
    joined = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or (line.startswith("#") and not joined):
            continue
        if line.endswith("\\"):
            joined += line[:-1] + " "
            continue
        lines.append(joined + line)
        joined = ""
    out = []
    for line in lines:
        key, _, args = line.partition(" ")
        out.append((key.upper(), args.strip()))
    return out
