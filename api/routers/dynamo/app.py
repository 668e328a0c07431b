"""The Dynamo standalone KV indexer API as its own app, mounted under a prefix or served on
its own port (kvsi/serve.py), off unless configured (`dynamo_api`).

Imports neither zmq nor subscriber/. Errors are Dynamo's `{"error": "<sentence>"}`, with
this project's statuses: 400 for any bad input (naming it), 404, 409, 503.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException

from kvsi.api.auth import UNAUTHORIZED, TokenCheck, require_token
from kvsi.api.body import DEFAULT_MAX_BODY_BYTES, RequestBodies
from kvsi.api.errors import describe_validation_errors, http_error_detail
from kvsi.api.observe import NO_NATIVE_TELEMETRY, observe
from kvsi.api.routers.dynamo import routes
from kvsi.api.routers.dynamo.registry import guarded_door
from kvsi.api.routers.dynamo.routes import DynamoOptions
from kvsi.hashing.dynamo import tokens_seed
from kvsi.store.base import IndexStore

DESCRIPTION = """\
Dynamo's standalone KV indexer HTTP API (`python -m dynamo.indexer`), answered from the
kv-session-index: `/query_by_hash`, `/query`, `/workers`, `/register`, `/unregister`, `/dump`,
`/health`. Scores are matched tokens per instance id and dp_rank; `instances` adds the gpu,
cpu and disk tiers (cumulative) and `longest_matched`. `block_hashes` are Dynamo's local
block hashes (each block's tokens hashed), as signed 64-bit ints. Errors are `{"error": "..."}`.
"""


def create_dynamo_app(
    store: IndexStore,
    options: DynamoOptions | None = None,
    *,
    tokens: Sequence[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """The Dynamo API over `store` (opened and closed by the caller).

    Checks at once that Dynamo's block hash can be computed (the xxhash package), so a
    missing package stops the service at start, not a query.
    `tokens`: bearer tokens every endpoint but `/health` requires (none: open). A body over
    `max_body_bytes` is a 413, refused before it is read whole; bodies are JSON whatever
    their Content-Type says. Swagger UI's files are the package's own (fastapi-offline).
    """
    options = options or DynamoOptions()
    tokens_seed()
    app = FastAPIOffline(
        title="kv-session-index: Dynamo KV indexer API",
        description=DESCRIPTION,
        docs_url="/docs",
        redoc_url=None,
        telemetry=NO_NATIVE_TELEMETRY,
    )
    app.state.door = guarded_door(store)
    app.state.dynamo_options = options
    app.state.token_check = TokenCheck(tokens)
    app.add_exception_handler(RequestValidationError, _bad_input)
    app.add_exception_handler(HTTPException, _refused)
    app.add_middleware(RequestBodies, max_bytes=max_body_bytes)
    observe(app)
    protected = [Depends(require_token)] if tokens else []
    app.include_router(
        routes.router, dependencies=protected, responses=UNAUTHORIZED if tokens else {}
    )
    app.include_router(routes.probe_router)
    _document_errors(app)
    return app


async def _bad_input(request: Request, exc: Exception) -> JSONResponse:
    """As Dynamo answers: a body of the wrong shape or types (what serde refuses) is a 422;
    a body that is not JSON, a bad query string, or a value Dynamo's handlers check
    themselves (an endpoint's scheme, `cache_salt` on `/query_by_hash`: our validators'
    `value_error`) a 400."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    shape = all(
        e["loc"][:1] == ("body",) and e["type"] not in ("json_invalid", "value_error")
        for e in errors
    )
    return JSONResponse(
        status_code=422 if shape else 400, content={"error": describe_validation_errors(errors)}
    )


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return JSONResponse(
        status_code=exc.status_code, content={"error": http_error_detail(exc)}, headers=exc.headers
    )


def _document_errors(app: FastAPI) -> None:
    """Make OpenAPI match the handlers: 422 for a body Dynamo's serde would refuse, 400 for
    the rest, errors shaped `{"error"}`."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = build()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    responses = operation.get("responses", {})
                    if responses.pop("422", None) is not None and "requestBody" in operation:
                        responses["422"] = {
                            "description": "A body of the wrong shape or types.",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/DynamoError"}
                                }
                            },
                        }
                    if "401" in responses:
                        responses["401"]["content"] = {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/DynamoError"}
                            }
                        }
            components = schema.get("components", {}).get("schemas", {})
            components.pop("HTTPValidationError", None)
            components.pop("ValidationError", None)
            components.pop("ErrorResponse", None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
