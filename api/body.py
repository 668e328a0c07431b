"""How request bodies are read: bounded, and as JSON whatever their Content-Type says.

Imports neither zmq nor subscriber/. A body over the limit is a 413 before it is read whole:
a Content-Length over it is refused before a byte is read, a chunked body once the bytes
received pass it. FastAPI's own `max_body_size` is not used: it answers its own plain-text
413 over any error body, and the API's errors are one JSON sentence.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvsi.api.errors import body_too_large

DEFAULT_MAX_BODY_BYTES = 12 * 1024 * 1024
"""Above the largest legal request: the Dynamo API's `/query` with its 1,048,576 token
ids of 10 digits is 11,534,336 bytes plus names under 3 KB; `/v1/route`'s largest (262,144
token ids, 1,024 candidates) is under 3.2 MB. The settings' `max_body_bytes` default."""

_TYPE = b"content-type"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class RequestBodies:
    """Refuses a body over `max_bytes` with a 413 (`Connection: close`: the rest is not
    read), and has FastAPI read every body as JSON, whatever its Content-Type says
    (multipart aside).

    The 413 is raised from `receive`, so the app whose route reads the body words it as it
    words every error (the Dynamo API mounted in the REST API answers `{"error": ...}`): a
    declared Content-Length over the limit at the first read, before a byte is taken; a
    chunked body once the bytes received pass it, so it is never held whole. A route that
    reads no body reads none of it either.

    FastAPI parses a body as JSON only under `application/json` (or `+json`); `curl -d`,
    the examples' way of posting, sends `application/x-www-form-urlencoded`, and a body
    without a type is not parsed either. No route here takes a form, so the declared type
    is overridden: a JSON body is accepted as sent, and a body that is not JSON is a 400
    saying so (not one about its Content-Type). Except across sites: a web page may POST a
    `text/plain` body anywhere without asking first (no CORS preflight), so a cross-site
    request (`Sec-Fetch-Site: cross-site`, or an `Origin` other than the `Host`) without a
    JSON type is a 415, and an open API cannot be driven from a browser tab.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, media = _length_and_type(scope["headers"])
        bounded = _bounded(receive, declared or 0, self.max_bytes)
        if scope["method"] in _BODY_METHODS and not _keeps(media):
            if _cross_site(scope["headers"]):
                bounded = _refused(_CROSS_SITE)
            # In place: the outer middleware reads what routing writes into this scope.
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != _TYPE] + [
                (_TYPE, b"application/json")
            ]
        await self.app(scope, bounded, send)


def _bounded(receive: Receive, declared: int, max_bytes: int) -> Receive:
    """`receive`, raising the 413 instead of reading a body over `max_bytes`."""
    received = 0

    async def bounded() -> Message:
        nonlocal received
        if declared > max_bytes:
            raise _too_large(max_bytes)
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > max_bytes:
                raise _too_large(max_bytes)
        return message

    return bounded


_CROSS_SITE = HTTPException(
    status_code=415,
    detail="body: a cross-site request must send Content-Type: application/json",
)


def _refused(error: HTTPException) -> Receive:
    """A `receive` that raises `error` when the route reads the body."""

    async def refused() -> Message:
        raise error

    return refused


def _cross_site(headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a browser sent the request from another site: its `Sec-Fetch-Site` says so,
    or (older browsers) its `Origin` is not the `Host` it was sent to."""
    found = {name.lower(): value for name, value in headers}
    site = found.get(b"sec-fetch-site")
    if site is not None:
        return site == b"cross-site"
    origin = found.get(b"origin")
    if origin is None:
        return False
    return urlsplit(origin.decode("latin-1")).netloc != found.get(b"host", b"").decode("latin-1")


def _too_large(max_bytes: int) -> HTTPException:
    return HTTPException(
        status_code=413, detail=body_too_large(max_bytes), headers={"Connection": "close"}
    )


def _length_and_type(headers: list[tuple[bytes, bytes]]) -> tuple[int | None, bytes]:
    """The declared Content-Length (None: absent, or not a number) and Content-Type."""
    length: int | None = None
    media = b""
    for name, value in headers:
        lowered = name.lower()
        if lowered == b"content-length" and value.isdigit():
            length = int(value)
        elif lowered == _TYPE:
            media = value.lower()
    return length, media


def _keeps(content_type: bytes) -> bool:
    """Whether a declared type stays as is: JSON already, or a multipart upload."""
    media = content_type.split(b";", 1)[0].strip()
    return (
        media == b"application/json" or media.endswith(b"+json") or media.startswith(b"multipart/")
    )
