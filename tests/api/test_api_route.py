"""`POST /v1/route` as a router uses it: rankings flip with evictions; prompts hash like vLLM."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from kvsi import hashing
from kvsi.api import create_app
from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    WorkerKey,
    WorkerState,
    WorkerStatus,
)
from tests.api.harness import client_for

A = WorkerKey("pod-a", 0)
B = WorkerKey("pod-b", 0)
C = WorkerKey("pod-c", 0)


async def route(client: httpx.AsyncClient, body: dict[str, Any], status: int = 200) -> Any:
    response = await client.post("/v1/route", json=body)
    assert response.status_code == status, response.text
    return response.json()


@pytest.fixture
async def store() -> MemoryStore:
    s = MemoryStore()
    for key in (A, B, C):
        await s.set_status(key, WorkerStatus(WorkerState.LIVE, 1.0))
    return s


async def test_session_ranks_the_pod_holding_more_then_flips_after_eviction(
    store: MemoryStore,
) -> None:
    await store.apply(A, Batch(0, 1.0, [EntriesStored([1, 2, 3, 4], "GPU", 0, "s")]))
    await store.apply(B, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s")]))
    async with client_for(create_app(store)) as client:
        first = await route(client, {"session_id": "s"})
        assert [(r["pod"], r["score"], r["session_blocks"]) for r in first["ranking"]] == [
            ("pod-a", 4.0, 4),
            ("pod-b", 2.0, 2),
            ("pod-c", 0.0, 0),
        ]
        await store.apply(A, Batch(1, 2.0, [EntriesRemoved([1, 2, 3], "GPU", 0)]))
        after = await route(client, {"session_id": "s"})
        assert [r["pod"] for r in after["ranking"]] == ["pod-b", "pod-a", "pod-c"]


async def test_prompt_prefix_decides_and_media_are_weighted(store: MemoryStore) -> None:
    await store.apply(A, Batch(0, 1.0, [EntriesStored([10, 11, 12], "CPU", 0, None)]))
    await store.apply(B, Batch(0, 1.0, [EntriesStored([10, 11], "GPU", 0, None)]))
    await store.apply(C, Batch(0, 1.0, [EntriesStored([11, 12, 13], "GPU", 0, None)]))
    body = {"block_hashes": ["10", "11", "12", "13"]}
    async with client_for(create_app(store)) as client:
        ranked = (await route(client, body))["ranking"]
        assert [(r["pod"], r["prefix_blocks"], r["score"]) for r in ranked] == [
            ("pod-a", 3, 2.4),
            ("pod-b", 2, 2.0),
            ("pod-c", 0, 0.0),
        ]
        cpu_cheap = (await route(client, body | {"weights": {"CPU": 0.5}}))["ranking"]
        assert [r["pod"] for r in cpu_cheap] == ["pod-b", "pod-a", "pod-c"]
        only_c = (await route(client, body | {"candidates": ["pod-c", "pod-x/3"]}))["ranking"]
        assert [r["pod"] for r in only_c] == ["pod-c"]


async def test_token_ids_are_hashed_exactly_as_the_engine_does(store: MemoryStore) -> None:
    tokens = list(range(64))
    engine_hashes = hashing.block_hashes(tokens, block_size=16)
    await store.apply(A, Batch(0, 1.0, [EntriesStored(list(engine_hashes[:3]), "GPU", 0, "s")]))
    async with client_for(create_app(store)) as client:
        answer = await route(client, {"token_ids": [*tokens, 1, 2, 3], "session_id": "s"})
    assert answer["prompt_blocks"] == 4
    assert answer["block_hashes"] == [str(h) for h in engine_hashes]
    best = answer["ranking"][0]
    assert (best["pod"], best["prefix_blocks"], best["session_blocks"]) == ("pod-a", 3, 3)


async def test_ties_are_deterministic_and_degraded_workers_show_their_state(
    store: MemoryStore,
) -> None:
    await store.set_status(A, WorkerStatus(WorkerState.DEGRADED, 2.0, "gap"))
    await store.set_status(C, WorkerStatus(WorkerState.DISCONNECTED, 2.0))
    await store.apply(A, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))
    await store.apply(B, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))
    async with client_for(create_app(store)) as client:
        ranked = (await route(client, {"session_id": "s"}))["ranking"]
    assert [(r["pod"], r["state"]) for r in ranked] == [("pod-b", "live"), ("pod-a", "degraded")]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "give session_id, block_hashes or token_ids"),
        ({"block_hashes": ["1"], "token_ids": [1]}, "not both"),
        ({"block_hashes": ["12x"]}, "neither a decimal integer nor 0x-hex"),
        ({"session_id": "a b"}, "session_id"),
        ({"session_id": "s", "candidates": ["Bad_Pod"]}, "is not POD or POD/RANK"),
        ({"session_id": "s", "weights": {"gpu": 1}}, "weights"),
        ({"token_ids": [-1]}, "token_ids"),
        ({"token_ids": [1] * 16, "hashing": {"algorithm": "md5"}}, "algorithm"),
        ({"token_ids": [1] * 16, "hashing": {"algorithm": "xxhash"}}, "hashing"),
        ({"session_id": "s", "surprise": 1}, "surprise"),
    ],
)
async def test_bad_bodies_get_a_400_saying_what_is_wrong(
    store: MemoryStore, body: dict[str, Any], message: str
) -> None:
    async with client_for(create_app(store)) as client:
        answer = await route(client, body, status=400)
    assert message in answer["detail"]
