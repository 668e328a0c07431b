"""How the API says no: every error is `{"detail": "<one readable sentence>"}`.

Imports neither zmq nor subscriber/. A bad request parameter is a 400 naming the parameter,
the rule it breaks and the value received (FastAPI's default is a 422 with a list of
pydantic error objects; one status and one shape for every bad parameter, the cursor
included, keeps clients simple).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from api.params import RULES

_MAX_ECHO = 80
"""Echo at most this much of a bad value: enough to recognise it, not a reflected page."""

_PLACES = {"path": "path parameter", "query": "query parameter", "header": "header"}


def describe_validation_errors(errors: Sequence[Any]) -> str:
    """One sentence per pydantic error, joined: "query parameter 'limit': must be ... (got ...)"."""
    return "; ".join(_describe(err) for err in errors if isinstance(err, Mapping))


def _describe(err: Mapping[str, Any]) -> str:
    loc = [str(part) for part in err.get("loc", ())]
    kind = str(err.get("type", ""))
    name = loc[1] if len(loc) > 1 else None
    if loc and loc[0] == "body" and name:
        where = f"body field {_body_path(err['loc'][1:])!r}"
    elif name:
        where = f"{_PLACES.get(loc[0], loc[0])} {_body_path(err['loc'][1:])!r}"
    else:
        where = f"{loc[0]} string" if loc else "request"
    if kind == "string_pattern_mismatch" and name in RULES:
        message = RULES[name]
    elif kind == "value_error" and "error" in err.get("ctx", {}):
        message = str(err["ctx"]["error"])  # our own ValueError: no "Value error, " prefix
    else:
        message = str(err.get("msg", "is invalid")).replace("Input should", "should", 1)
    if kind == "missing" or "input" not in err or isinstance(err["input"], Mapping):
        return f"{where}: {message}"
    shown = repr(err["input"])
    if len(shown) > _MAX_ECHO:
        shown = shown[:_MAX_ECHO] + "..."
    return f"{where}: {message} (got {shown})"


def _body_path(parts: Sequence[Any]) -> str:
    """`token_ids[3]`, `hashing.algorithm`: where in a JSON body the bad value sits."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "[key]":
            out += " (key)"
        else:
            out += f".{part}" if out else str(part)
    return out


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    detail = describe_validation_errors(exc.errors())
    return JSONResponse(status_code=400, content={"detail": detail})


def install_error_handlers(app: FastAPI) -> None:
    """Register the handler that turns FastAPI's 422 into the ErrorResponse 400.

    HTTPException needs nothing: Starlette already answers `{"detail": <str>}`.
    """
    app.add_exception_handler(RequestValidationError, _on_validation_error)
