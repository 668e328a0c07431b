"""Fixture paths of the kvsi tests."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
RECORDED_WATCH = FIXTURES / "pod-watch.jsonl"
"""A pod watch stream in the Kubernetes wire format (one event per line)."""
