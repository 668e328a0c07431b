"""Optional OpenTelemetry tracing: off unless the `otel` extra is installed and the standard
OTEL_* variables ask for it.

Imports kvsi.version only of kvsi, and opentelemetry only once tracing is turned on: a process
without the extra, or not asked to trace, pays one `is None` test per traced operation.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

import structlog

from kvsi.version import package_version

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Tracer

log = structlog.get_logger(__name__)

SERVICE_NAME = "kv-session-index"
"""`service.name` unless OTEL_SERVICE_NAME (or OTEL_RESOURCE_ATTRIBUTES) names another."""

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_provider: TracerProvider | None = None
_tracer: Tracer | None = None


def requested(env: Mapping[str, str]) -> bool:
    """Whether the OTEL_* variables ask for traces: an OTLP endpoint, or OTEL_TRACES_EXPORTER
    naming an exporter; never with OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER")
    if exporter is not None:
        return exporter.strip().lower() not in ("", "none")
    return any(env.get(name) for name in _ENDPOINTS)


def configure(env: Mapping[str, str] = os.environ, exporter: SpanExporter | None = None) -> bool:
    """Turn tracing on if `env` asks for it (or an `exporter` is given: tests); True if on.

    Spans go where OTEL_TRACES_EXPORTER lists (default `otlp`; `otlp`, `console`,
    comma-separated): OTLP over HTTP (the exporter reads OTEL_EXPORTER_OTLP_* itself),
    stdout. The sampler, resource attributes and batch sizes follow their OTEL_* variables.
    Asked for without the `otel` extra: a warning, no tracing (the service still starts)."""
    global _provider, _tracer
    if exporter is None and not requested(env):
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    except ImportError:
        log.warning("tracing.unavailable", fix="pip install 'kv-session-index[otel]'")
        return False
    named = "OTEL_SERVICE_NAME" in env or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    resource = Resource.create({} if named else {"service.name": SERVICE_NAME})
    provider = TracerProvider(resource=resource)
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        names = env.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",")
        chosen = [_exporter(name.strip()) for name in names if name.strip()]
        usable = [each for each in chosen if each is not None]
        if len(usable) < len(chosen):
            return False
        for each in usable:
            provider.add_span_processor(BatchSpanProcessor(each))
    shutdown()
    _provider, _tracer = provider, provider.get_tracer("kvsi", package_version())
    log.info("tracing.on", service=resource.attributes.get("service.name"))
    return True


def tracer() -> Tracer | None:
    """The tracer, or None while tracing is off."""
    return _tracer


def shutdown() -> None:
    """Export what is buffered and turn tracing off (at the service's stop)."""
    global _provider, _tracer
    if _provider is not None:
        _provider.shutdown()
    _provider = _tracer = None


def _exporter(name: str) -> SpanExporter | None:
    """OTEL_TRACES_EXPORTER's exporter: `otlp` (over HTTP: the extra's) or `console`."""
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name != "otlp":
        log.warning("tracing.unknown_exporter", exporter=name, valid=["otlp", "console"])
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()
