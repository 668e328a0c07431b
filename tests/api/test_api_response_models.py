"""The hot endpoints build their bodies by hand: each must be, byte for byte, what its
documented response model would serialize."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from kvsi.api import create_app
from kvsi.api.routes.route import RouteResponse
from kvsi.api.schemas import SessionResponse
from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    WorkerKey,
    WorkerState,
    WorkerStatus,
)
from tests.api.harness import BIG, DIGESTS, client_for

A = WorkerKey("pod-a", 0)
A1 = WorkerKey("pod-a", 1)
B = WorkerKey("pod-b", 0)
GONE = WorkerKey("pod-c", 2)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    store = MemoryStore()
    await store.set_status(A, WorkerStatus(WorkerState.LIVE, 1.5))
    await store.set_status(A1, WorkerStatus(WorkerState.DEGRADED, 2.25, "gap"))
    await store.set_status(GONE, WorkerStatus(WorkerState.DISCONNECTED, 3.0))
    when = 1795945570.89
    await store.apply(
        A,
        Batch(
            0,
            when,
            [
                EntriesStored([1, 2, 3, BIG[0]], "GPU", 0, "s", block_size=16),
                EntriesStored([4, 5], "CPU", 0, "s", parent_block_hash=BIG[0]),
                EntriesStored([DIGESTS[0]], "DISK", 1, "t", parent_block_hash=DIGESTS[1]),
            ],
        ),
    )
    await store.apply(A1, Batch(0, 17.0, [EntriesStored([1, 2], "GPU", 0, "s", block_size=16)]))
    # Everything of "s" on A1 evicted: listed with 0 blocks, 2 lost, 32 tokens to prefill.
    await store.apply(A1, Batch(1, 18.0, [EntriesRemoved([1, 2], "GPU", 0)]))
    await store.apply(B, Batch(0, 1e16, [EntriesStored([1, 2, 3], "CPU", 0, "s")]))
    await store.apply(GONE, Batch(0, 5.0, [EntriesStored([1], "GPU", 0, "s")]))
    async with client_for(create_app(store)) as c:
        yield c


def assert_is_model_json(response: httpx.Response, model: type[BaseModel]) -> None:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert (
        response.content == model.model_validate_json(response.content).model_dump_json().encode()
    )


@pytest.mark.parametrize("session", ["s", "t"])
async def test_session_view_is_its_response_model_json(
    client: httpx.AsyncClient, session: str
) -> None:
    response = await client.get(f"/v1/sessions/{session}")

    assert_is_model_json(response, SessionResponse)
    assert response.json()["pods"][0]["pod"] == "pod-a"
    assert response.json()["pods"][0]["frontier"] is not None


@pytest.mark.parametrize(
    "body",
    [
        {"session_id": "s"},
        {"session_id": "s", "limit": 2, "weights": {"CPU": 0.3, "DISK": 0.7}},
        {"session_id": "s", "weights": {"GPU": 0, "CPU": 0}},
        {"block_hashes": ["1", "2", "3", str(BIG[0])], "session_id": "s"},
        {"block_hashes": ["0x" + DIGESTS[0].hex()], "candidates": ["pod-a", "pod-c/2"]},
        {"token_ids": list(range(40)), "session_id": "t"},
        {"session_id": "nobody"},
    ],
)
async def test_route_answer_is_its_response_model_json(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> None:
    response = await client.post("/v1/route", json=body)

    assert_is_model_json(response, RouteResponse)
    assert response.json()["ranking"], "every body above ranks some worker"
