"""Tracing on for one test, into an in-memory exporter (kvsi.tracing's test entry)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvsi import tracing


@contextmanager
def traced() -> Iterator[InMemorySpanExporter]:
    """Tracing on, every finished span kept in the exporter; off again afterwards."""
    exporter = InMemorySpanExporter()
    assert tracing.configure({}, exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()
