"""The app as a whole: OpenAPI lists every route and matches the error contract; the API
imports neither zmq nor the subscriber."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog
from prometheus_client import REGISTRY

from kvsi.api import create_app
from kvsi.store.memory import MemoryStore
from tests.api.harness import client_for, get_json

ROUTES = {
    "/v1/sessions": {"get"},
    "/v1/sessions/{session_id}": {"get"},
    "/v1/sessions/{session_id}/blocks": {"get"},
    "/v1/sessions/{session_id}/hint": {"get"},
    "/v1/pods": {"get"},
    "/v1/pods/{pod}/blocks": {"get"},
    "/healthz": {"get"},
    "/readyz": {"get"},
    "/metrics": {"get"},
    "/v1/route": {"post"},
    "/v1/watch": {"get"},
}


async def test_openapi_lists_every_route(client: httpx.AsyncClient) -> None:
    spec = await get_json(client, "/openapi.json")

    assert {path: set(ops) for path, ops in spec["paths"].items()} == ROUTES
    assert "KV-cache" in spec["info"]["description"]
    assert "Block hashes are strings" in spec["info"]["description"]


async def test_openapi_documents_400_errors_and_no_422(client: httpx.AsyncClient) -> None:
    spec = await get_json(client, "/openapi.json")

    for path, ops in spec["paths"].items():
        op = ops.get("get") or ops["post"]
        responses = op["responses"]
        assert "422" not in responses, path
        if op.get("parameters") or op.get("requestBody"):
            ref = responses["400"]["content"]["application/json"]["schema"]["$ref"]
            assert ref == "#/components/schemas/ErrorResponse", path
    assert "HTTPValidationError" not in spec["components"]["schemas"]


async def test_openapi_states_the_parameter_rules(client: httpx.AsyncClient) -> None:
    spec = await get_json(client, "/openapi.json")

    def param(path: str, name: str) -> dict[str, Any]:
        [p] = [p for p in spec["paths"][path]["get"]["parameters"] if p["name"] == name]
        return p  # type: ignore[no-any-return]

    blocks = "/v1/pods/{pod}/blocks"
    assert param(blocks, "limit")["schema"] == {
        "type": "integer",
        "maximum": 1000,
        "minimum": 1,
        "default": 100,
        "description": "Items per page.",
        "title": "Limit",
    }
    assert param(blocks, "pod")["schema"]["maxLength"] == 253
    assert param(blocks, "medium")["schema"]["anyOf"][0]["pattern"] == "^[A-Z][A-Z0-9_]{0,31}$"
    assert param("/v1/sessions/{session_id}", "session_id")["schema"]["maxLength"] == 256


async def test_swagger_ui_is_served_at_docs(client: httpx.AsyncClient) -> None:
    response = await client.get("/docs")

    assert response.status_code == 200
    assert "swagger-ui" in response.text.lower()


async def test_the_store_is_on_app_state() -> None:
    store = MemoryStore()
    assert create_app(store).state.store is store


def test_importing_the_api_loads_neither_zmq_nor_the_subscriber() -> None:
    root = Path(__file__).resolve().parents[2]
    probe = (
        "import sys, kvsi.api.app, kvsi.api.routes.sessions, kvsi.api.routes.health\n"
        "bad = sorted(m for m in sys.modules\n"
        "             if m.split('.')[0] == 'zmq' or m.startswith('kvsi.subscriber'))\n"
        "assert not bad, bad\n"
        "assert 'fastapi' in sys.modules\n"
    )

    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("access_log", [True, False])
async def test_the_access_log_can_be_off_and_requests_are_still_counted(access_log: bool) -> None:
    app = create_app(MemoryStore(), access_log=access_log)
    labels = {"method": "GET", "route": "/v1/sessions/{session_id}", "status": "404"}
    before = REGISTRY.get_sample_value("kvsi_http_requests_total", labels) or 0.0
    with structlog.testing.capture_logs() as logged:
        async with client_for(app) as client:
            assert (await client.get("/v1/sessions/nobody")).status_code == 404
            assert (await client.get("/v1/pods")).status_code == 200
    lines = [e for e in logged if e["event"] == "http.request"]
    assert [e["route"] for e in lines] == (
        ["/v1/sessions/{session_id}", "/v1/pods"] if access_log else []
    )
    assert REGISTRY.get_sample_value("kvsi_http_requests_total", labels) == before + 1
