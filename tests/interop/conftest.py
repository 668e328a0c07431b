"""The interop tier runs where vLLM imports: skipped elsewhere, required when demanded.

`make interop` and CI set KVSI_INTEROP=1: a vLLM that does not import is then an error, not a
skip, so a broken install cannot pass for a green tier. This file imports no vLLM unless it
is demanded (`make test` collects this folder in the light virtualenv).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Protocol

import pytest

from kvsi.store.memory import MemoryStore
from kvsi.subscriber.stream import PublisherSpec
from tests.faults.harness import Sidecar

DEMANDED = os.environ.get("KVSI_INTEROP") == "1"

if DEMANDED:
    try:
        importlib.import_module("vllm.v1.core.kv_cache_manager")
    except ImportError as exc:
        raise pytest.UsageError(
            f"KVSI_INTEROP=1 demands vLLM, which does not import ({exc}): run `make interop`"
        ) from exc


class Publisher(Protocol):
    """Where one worker publishes (a tests.interop.engines.VllmWorker)."""

    endpoint: str
    replay_endpoint: str


StartSidecar = Callable[[Mapping[tuple[str, int], Publisher]], Awaitable[Sidecar]]


@pytest.fixture
async def sidecars() -> AsyncIterator[StartSidecar]:
    """Starts kvsi's ingest and API in this process on a memory store, subscribed to the
    given workers ((pod, DP rank) -> endpoints) over loopback; every one stopped after."""
    started: list[Sidecar] = []

    async def start(workers: Mapping[tuple[str, int], Publisher]) -> Sidecar:
        specs = [
            PublisherSpec(pod, w.endpoint, w.replay_endpoint, dp_rank=rank)
            for (pod, rank), w in workers.items()
        ]
        sidecar = await Sidecar(MemoryStore(), specs).start()
        started.append(sidecar)
        return sidecar

    try:
        yield start
    finally:
        for sidecar in started:
            await sidecar.stop()
