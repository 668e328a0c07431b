"""How the API says no: every error is one readable sentence naming what is wrong.

Imports neither zmq nor subscriber/. A bad request parameter or body field is a 400 naming
it, the rule it breaks and the value received (FastAPI's default is a 422 with a list of
pydantic error objects; one status and one shape for every bad input, the cursor included,
keeps clients simple). The wording is this module's, never pydantic's internals or a raw
regex, and is shared by the REST API (`{"detail": ...}`) and the Dynamo API
(`{"error": ...}`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from kvsi.api.params import PATTERN_RULES, RULES

_MAX_ECHO = 80
"""Echo at most this much of a bad value: enough to recognise it, not a reflected page."""

_PLACES = {"path": "path parameter", "query": "query parameter", "header": "header"}

_NOT_AN_OBJECT = frozenset({"model_type", "model_attributes_type", "dict_type"})
_TOO_MANY = frozenset({"too_long", "too_short"})
_PYDANTIC_SUBJECT = re.compile(r"^(Input|String|List|Dictionary|Value|Decimal) should\b")
"""pydantic opens its messages with the kind of value ("String should have at most..."):
the sentence here already says which value, so it reads "should ..."."""


def describe_validation_errors(errors: Sequence[Any]) -> str:
    """One sentence per pydantic error, joined: "query parameter 'limit': must be ... (got ...)"."""
    return "; ".join(_describe(err) for err in errors if isinstance(err, Mapping))


def body_too_large(limit: int) -> str:
    """The 413's sentence."""
    return f"request body is larger than {limit} bytes (setting max_body_bytes)"


def _describe(err: Mapping[str, Any]) -> str:
    kind = str(err.get("type", ""))
    loc = list(err.get("loc", ()))
    if kind == "json_invalid":
        detail = err.get("ctx", {}).get("error", "")
        at = f" at character {loc[1]}" if len(loc) > 1 else ""
        return f"body: is not valid JSON ({detail}{at})"
    message = _message(kind, err, str(loc[-1]) if len(loc) > 1 else None)
    if kind == "missing" or kind in _TOO_MANY or "input" not in err:
        return f"{_where(loc)}: {message}"
    if isinstance(err["input"], Mapping) or kind in _NOT_AN_OBJECT:
        return f"{_where(loc)}: {message}"
    shown = repr(err["input"])
    if len(shown) > _MAX_ECHO:
        shown = shown[:_MAX_ECHO] + "..."
    return f"{_where(loc)}: {message} (got {shown})"


def _where(loc: Sequence[Any]) -> str:
    """`body field 'hashing.block_size'`, `query parameter 'limit'`, `body`, `query string`."""
    if not loc:
        return "request"
    if len(loc) == 1:
        return "body" if loc[0] == "body" else f"{loc[0]} string"
    place = "body field" if loc[0] == "body" else _PLACES.get(str(loc[0]), str(loc[0]))
    return f"{place} {_path(loc[1:])!r}"


def _message(kind: str, err: Mapping[str, Any], name: str | None) -> str:
    ctx: Mapping[str, Any] = err.get("ctx", {})
    if kind == "string_pattern_mismatch":
        rule = RULES.get(name or "") or PATTERN_RULES.get(str(ctx.get("pattern", "")))
        return rule or "has a character or form that is not allowed"
    if kind == "value_error" and "error" in ctx:
        return str(ctx["error"])  # our own ValueError: no "Value error, " prefix
    if kind == "missing":
        return "is required"
    if kind in _NOT_AN_OBJECT:
        return "must be a JSON object"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items (got {ctx.get('actual_length')})"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} items (got {ctx.get('actual_length')})"
    return _PYDANTIC_SUBJECT.sub("should", str(err.get("msg", "is invalid")), count=1)


def _path(parts: Sequence[Any]) -> str:
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


_UNPARSED = "There was an error parsing the body"
"""FastAPI's words for a body it could not decode at all (not UTF-8, nested too deep)."""


def http_error_detail(exc: HTTPException) -> str:
    """An HTTPException's detail in this module's words (FastAPI's own body error aside,
    every detail already is)."""
    if exc.status_code == 400 and exc.detail == _UNPARSED:
        cause = exc.__cause__
        if isinstance(cause, UnicodeDecodeError):
            return "body: is not valid JSON (not UTF-8 text)"
        if isinstance(cause, RecursionError):
            return "body: is not valid JSON here (nested too deeply)"
        return "body: is not valid JSON"
    return str(exc.detail)


def error_response(exc: HTTPException) -> JSONResponse:
    """The answer to an HTTPException: `{"detail": ...}`, its status and headers."""
    return JSONResponse(
        status_code=exc.status_code,
        content={"detail": http_error_detail(exc)},
        headers=exc.headers,
    )


async def _on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return error_response(exc)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    detail = describe_validation_errors(exc.errors())
    return JSONResponse(status_code=400, content={"detail": detail})


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn FastAPI's 422 into the ErrorResponse 400 and word
    its body-decoding 400 like every other error (`http_error_detail`)."""
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(HTTPException, _on_http_error)
