"""Paths to the vLLM wire fixtures copied from shared/vllm-wire."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
WIRE = FIXTURES / "vllm-wire"
