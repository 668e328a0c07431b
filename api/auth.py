"""Bearer-token access control for `/v1` (and, if asked, `/metrics`).

Imports fastapi only. Tokens are compared in constant time; with no token configured the
dependency lets every request through, so the embedded demo needs no setup.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from kvsi.api.schemas import ErrorResponse

UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "Missing or invalid bearer token."}
}
"""The extra response every guarded route documents."""

_bearer = HTTPBearer(
    auto_error=False,
    description="One of the tokens in the `api_tokens` setting; required only when set.",
)


class TokenCheck:
    """Accepts a request whose `Authorization: Bearer <token>` is one of `tokens`."""

    def __init__(self, tokens: Sequence[str]) -> None:
        self._tokens = [t.encode() for t in tokens if t]

    @property
    def enabled(self) -> bool:
        return bool(self._tokens)

    def accepts(self, token: str) -> bool:
        given = token.encode()
        # Compare against every token so the time taken does not reveal which one matched.
        matches = [secrets.compare_digest(given, t) for t in self._tokens]
        return any(matches)


def require_token(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),  # noqa: B008
) -> None:
    """FastAPI dependency: 401 unless the request carries an accepted bearer token."""
    check: TokenCheck = request.app.state.token_check
    if not check.enabled:
        return
    if credentials is None:
        raise HTTPException(
            status_code=401,
            detail="missing bearer token: send 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not check.accepts(credentials.credentials):
        raise HTTPException(
            status_code=401,
            detail="invalid bearer token",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
