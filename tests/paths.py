"""The repository's root, and the vLLM wire fixtures copied from shared/vllm-wire."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
WIRE = FIXTURES / "vllm-wire"
