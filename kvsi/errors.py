"""Mistakes in how the service was started, told as one line (the CLI exits 2 on them).

Imports pydantic only. Each message names what the user wrote (a flag, a setting, a file, an
endpoint) and what is wrong with it, so nobody has to read a traceback to find a typo.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError


class StartupError(Exception):
    """The service cannot start as configured; the message is the one line the user sees."""


_ENV_FIELD = re.compile(r'error parsing value for field "(?P<field>[^"]+)" from source')


def describe_validation(exc: ValidationError) -> str:
    """Every problem of a settings validation as `setting NAME: reason (got VALUE)`, joined."""
    return "; ".join(_describe_one(error) for error in exc.errors())


def _describe_one(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"]) or "settings"
    reason = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] in {"missing", "extra_forbidden"}:
        return f"setting {where}: {reason.lower()}"
    return f"setting {where}: {reason} (got {_shown(error.get('input'))})"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def describe_settings_error(exc: SettingsError) -> str:
    """A KVSI_* variable pydantic-settings could not parse (lists and tables are JSON)."""
    found = _ENV_FIELD.search(str(exc))
    if found is None:
        return str(exc)
    name = f"KVSI_{found['field'].upper()}"
    cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
    return (
        f"environment variable {name} is not valid JSON{cause}: lists and tables are "
        f'written as JSON, e.g. {name}=\'["a", "b"]\''
    )
