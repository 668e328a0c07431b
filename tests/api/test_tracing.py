"""Following a request: a span per API request under the caller's trace (`traceparent`),
for the REST routes (sessions, the hint, route) and Dynamo's API; `X-Request-ID` taken or
made, echoed, and in every log line the request writes. Tracing through kvsi.tracing into an
in-memory exporter; off, no span middleware at all."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import structlog
from opentelemetry.trace import SpanKind, StatusCode

from kvsi import tracing
from kvsi.api import create_app
from kvsi.api.observe import Spans
from kvsi.api.routers.dynamo import create_dynamo_app
from kvsi.store.memory import MemoryStore
from kvsi.store.model import EntriesStored, WorkerKey
from tests.api.harness import Feed, client_for
from tests.api.test_api_errors import DownStore
from tests.tracing import traced

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
POD = WorkerKey("pod-a", 0)


async def holding_a_session() -> MemoryStore:
    store = MemoryStore()
    await Feed(store)(POD, 10.0, EntriesStored([1, 2, 3], "GPU", 0, "sess-1", 16))
    return store


@pytest.mark.parametrize(
    ("method", "url", "body", "route"),
    [
        ("GET", "/v1/sessions/sess-1", None, "/v1/sessions/{session_id}"),
        ("GET", "/v1/sessions/sess-1/hint?format=llm-d", None, "/v1/sessions/{session_id}/hint"),
        ("POST", "/v1/route", {"session_id": "sess-1", "block_hashes": ["1"]}, "/v1/route"),
    ],
)
async def test_a_request_span_continues_the_callers_trace(
    method: str, url: str, body: object, route: str
) -> None:
    with traced() as spans:
        app = create_app(await holding_a_session())
        async with client_for(app) as client:
            response = await client.request(
                method, url, json=body, headers={"traceparent": TRACEPARENT}
            )
    assert response.status_code == 200, response.text
    (span,) = spans.get_finished_spans()
    assert span.name == f"{method} {route}" and span.kind is SpanKind.SERVER
    assert span.context is not None and span.parent is not None
    assert format(span.context.trace_id, "032x") == TRACE_ID, "the router's trace goes on"
    assert format(span.parent.span_id, "016x") == PARENT_ID, "under the router's span"
    attributes = dict(span.attributes or {})
    assert attributes["http.route"] == route
    assert attributes["http.response.status_code"] == 200
    assert attributes["kvsi.request_id"] == response.headers["x-request-id"]
    if "{session_id}" in route:
        assert attributes["kvsi.session_id"] == "sess-1"


async def test_a_request_without_a_trace_starts_one_and_a_server_error_marks_it_and_is_logged() -> (
    None
):
    merged = [structlog.contextvars.merge_contextvars]
    with traced() as spans, structlog.testing.capture_logs(processors=merged) as logs:
        async with client_for(create_app(DownStore())) as client:
            response = await client.get("/v1/pods", headers={"x-request-id": "req-503"})
    events = [line["event"] for line in logs]
    assert "http.request" in events and len(events) >= 2, "the store's failure is logged too"
    assert all(line["request_id"] == "req-503" for line in logs), logs
    (span,) = spans.get_finished_spans()
    assert span.parent is None, "no traceparent: a new trace"
    assert response.status_code == 503
    assert span.status.status_code is StatusCode.ERROR


async def test_dynamo_api_requests_get_spans_too() -> None:
    with traced() as spans:
        app = create_dynamo_app(await holding_a_session())
        async with client_for(app) as client:
            response = await client.get("/workers", headers={"traceparent": TRACEPARENT})
    assert response.status_code == 200
    (span,) = spans.get_finished_spans()
    assert span.name == "GET /workers"
    assert span.context is not None and format(span.context.trace_id, "032x") == TRACE_ID


async def test_no_span_middleware_while_tracing_is_off() -> None:
    assert tracing.tracer() is None
    app = create_app(MemoryStore())
    assert not [m for m in app.user_middleware if m.cls is Spans]


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("router-7f3a-0001", True),
        (None, False),
        ("has a space", False),
        ("x" * 129, False),
        ("tab\there", False),
    ],
)
async def test_the_request_id_is_taken_or_made_echoed_and_in_every_log_line(
    given: str | None, kept: bool
) -> None:
    headers = {} if given is None else {"x-request-id": given}
    app = create_app(await holding_a_session())
    with structlog.testing.capture_logs(
        processors=[structlog.contextvars.merge_contextvars]
    ) as logs:
        async with client_for(app) as client:
            response = await client.get("/v1/sessions/sess-1", headers=headers)
    echoed = response.headers["x-request-id"]
    if kept:
        assert echoed == given
    else:
        assert re.fullmatch(r"[0-9a-f]{32}", echoed), echoed
    lines = [line for line in logs if line["event"] == "http.request"]
    assert lines and all(line["request_id"] == echoed for line in lines)
    assert structlog.contextvars.get_contextvars().get("request_id") is None, "unbound after"


GLOBAL_PROVIDER = """
import asyncio, json, httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from kvsi.api import create_app
from kvsi.api.app import create_probe_app
from kvsi.api.routers.dynamo import create_dynamo_app
from kvsi.store.memory import MemoryStore

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

async def main():
    store = MemoryStore()
    for app, path in [(create_app(store), "/v1/sessions/nope"), (create_app(store), "/healthz"),
                      (create_probe_app(), "/healthz"), (create_dynamo_app(store), "/health")]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get(path)).status_code in (200, 404)
    print(json.dumps([s.name for s in exporter.get_finished_spans()]))

asyncio.run(main())
"""


def test_fastapis_own_telemetry_adds_no_span_under_a_global_provider() -> None:
    """Auto-instrumentation sets a global tracer provider: FastAPI's native telemetry would
    then trace every request a second time (its own server span, dependency and endpoint
    spans) beside kvsi's. A process of its own: a global provider cannot be unset."""
    done = subprocess.run(
        [sys.executable, "-c", GLOBAL_PROVIDER],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"KVSI_LOG_LEVEL": "warning"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
