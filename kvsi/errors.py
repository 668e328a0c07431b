"""Mistakes in how the service was started, told as one line (the CLI exits 2 on them).

Imports pydantic only. Each message names what the user wrote (a flag, a setting, a file, an
endpoint) and what is wrong with it, so nobody has to read a traceback to find a typo.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError


class StartupError(Exception):
    """The service cannot start as configured; the message is the one line the user sees."""


_ENV_FIELD = re.compile(r'error parsing value for field "(?P<field>[^"]+)" from source')


def describe_validation(
    exc: ValidationError,
    names: Callable[[Sequence[str | int]], list[str] | None],
    patterns: Mapping[str, str],
) -> str:
    """Every problem of a settings validation as `setting NAME: reason (got VALUE)`, joined;
    an unknown name is told with the names valid there (`names(path)`), a pattern by the
    rule it states (`patterns`), never as a regex."""
    return "; ".join(_describe_one(error, names, patterns) for error in exc.errors())


def _describe_one(
    error: Any,
    names: Callable[[Sequence[str | int]], list[str] | None],
    patterns: Mapping[str, str],
) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "settings"
    reason = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "string_pattern_mismatch":
        reason = patterns.get(error.get("ctx", {}).get("pattern", ""), "is not of the right form")
    if error["type"] == "extra_forbidden":
        valid = names(error["loc"][:-1]) or []
        return f"setting {where}: unknown; valid here: {', '.join(valid)}"
    if error["type"] == "missing":
        return f"setting {where}: {reason.lower()}"
    return f"setting {where}: {reason} (got {_shown(error.get('input'))})"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def describe_settings_error(exc: SettingsError, environ: Iterable[str]) -> str:
    """A KVSI_* variable pydantic-settings could not parse (lists and tables are JSON),
    named as it is set in `environ` (a nested one: `KVSI_DISCOVERY__LABELS`)."""
    found = _ENV_FIELD.search(str(exc))
    if found is None:
        return str(exc)
    prefix = f"KVSI_{found['field'].upper()}"
    names = sorted(n for n in environ if n == prefix or n.startswith(f"{prefix}__")) or [prefix]
    cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
    return (
        f"environment variable {' or '.join(names)} is not valid JSON{cause}: lists and "
        f'tables are written as JSON, e.g. \'["a", "b"]\' or \'{{"key": "value"}}\''
    )
