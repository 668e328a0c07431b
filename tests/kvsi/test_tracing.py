"""Tracing is off unless the standard OTEL_* variables ask for it; asked, a real `kvsi serve`
exports a span for a request under the caller's trace."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from kvsi.tracing import configure, requested, shutdown, tracer
from tests.deploy.test_observability import get, kvsi, wait_until
from tests.ports import free_port

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "kvsi"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
    ],
)
def test_only_the_otel_variables_turn_tracing_on(env: dict[str, str], on: bool) -> None:
    assert requested(env) is on


def test_an_unknown_exporter_keeps_tracing_off_and_a_list_turns_each_on() -> None:
    assert configure({"OTEL_TRACES_EXPORTER": "zipkin"}) is False
    assert tracer() is None
    try:
        assert configure({"OTEL_TRACES_EXPORTER": "console, otlp"}) is True
        assert tracer() is not None
    finally:
        shutdown()
    assert tracer() is None


@pytest.mark.e2e
def test_a_served_request_is_exported_under_the_callers_trace(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "kvsi.log"
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "kvsi-test"}
    with kvsi(log, "serve", "--demo", "--port", str(port), env=env) as proc:
        wait_until(lambda: get(f"{base}/healthz")[0] == 200, "the API", proc)
        request = urllib.request.Request(
            f"{base}/v1/pods",
            headers={"traceparent": f"00-{TRACE_ID}-b7ad6b7169203331-01", "x-request-id": "r-1"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.headers["x-request-id"] == "r-1"
    output = log.read_text()
    spans = [json.loads(s) for s in _json_objects(output) if '"trace_id"' in s]
    (span,) = [s for s in spans if s["name"] == "GET /v1/pods"]
    assert span["context"]["trace_id"] == f"0x{TRACE_ID}"
    assert span["parent_id"] == "0xb7ad6b7169203331"
    assert span["attributes"]["kvsi.request_id"] == "r-1"
    assert span["resource"]["attributes"]["service.name"] == "kvsi-test"
    assert any(s["name"] == "kvsi.apply" for s in spans), "the demo's batch applies too"


def _json_objects(text: str) -> list[str]:
    """The multi-line JSON objects the console exporter prints (one per span)."""
    objects, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "{":
            depth, start = depth + 1, (i if depth == 0 else start)
        elif char == "}" and depth:
            depth -= 1
            if depth == 0:
                objects.append(text[start : i + 1])
    return objects
