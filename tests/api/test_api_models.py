"""Models: `/v1/pods` shows each worker's model, `/v1/route` ranks only the request's model's
workers, and a worker registered with a Dynamo instance id comes with the headers that send
a request straight to it through Dynamo's frontend."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from kvsi.api import create_app
from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, EntriesStored, WorkerKey, WorkerState, WorkerStatus
from kvsi.store.registry import DynamoInstance
from tests.api.harness import client_for

LLAMA = WorkerKey("llama-0", 0)
LLAMA_1 = WorkerKey("llama-0", 1)
QWEN = WorkerKey("qwen-0", 0)
UNKNOWN = WorkerKey("anon-0", 0)
MODELS = {LLAMA: "meta-llama/Llama-3.1-8B", LLAMA_1: "meta-llama/Llama-3.1-8B", QWEN: "qwen"}


@pytest.fixture
async def store() -> MemoryStore:
    s = MemoryStore()
    for worker in (LLAMA, LLAMA_1, QWEN, UNKNOWN):
        await s.apply(worker, Batch(0, 1.0, [EntriesStored([1, 2, 3], "GPU", 0, "s")]))
        await s.set_status(worker, WorkerStatus(WorkerState.LIVE, 1.0, model=MODELS.get(worker)))
    return s


async def route(client: httpx.AsyncClient, body: dict[str, Any], status: int = 200) -> Any:
    response = await client.post("/v1/route", json=body)
    assert response.status_code == status, response.text
    return response.json()


async def test_pods_show_each_workers_model_or_null(store: MemoryStore) -> None:
    async with client_for(create_app(store)) as client:
        pods = (await client.get("/v1/pods")).json()["pods"]

    assert {(p["pod"], p["dp_rank"]): p["model"] for p in pods} == {
        ("anon-0", 0): None,
        ("llama-0", 0): "meta-llama/Llama-3.1-8B",
        ("llama-0", 1): "meta-llama/Llama-3.1-8B",
        ("qwen-0", 0): "qwen",
    }


async def test_a_route_with_a_model_ranks_only_that_models_workers(store: MemoryStore) -> None:
    body = {"block_hashes": ["1", "2"], "model": "meta-llama/Llama-3.1-8B"}
    async with client_for(create_app(store)) as client:
        llama = await route(client, body)
        qwen = await route(client, body | {"model": "qwen"})
        nobody = await route(client, body | {"model": "mistral"})
        every = await route(client, {"block_hashes": ["1", "2"]})

    assert [(r["pod"], r["dp_rank"]) for r in llama["ranking"]] == [("llama-0", 0), ("llama-0", 1)]
    assert [r["pod"] for r in qwen["ranking"]] == ["qwen-0"]
    assert nobody["ranking"] == []
    assert len(every["ranking"]) == 4  # without a model, unknown-model workers rank too


async def test_candidates_and_model_both_restrict(store: MemoryStore) -> None:
    body = {"session_id": "s", "candidates": ["llama-0/1", "qwen-0"], "model": "qwen"}
    async with client_for(create_app(store)) as client:
        ranked = await route(client, body)

    assert [r["pod"] for r in ranked["ranking"]] == ["qwen-0"]


@pytest.mark.parametrize("model", ["", "m" * 257])
async def test_a_bad_model_is_400(store: MemoryStore, model: str) -> None:
    async with client_for(create_app(store)) as client:
        answer = await route(client, {"session_id": "s", "model": model}, 400)

    assert "body field 'model'" in answer["detail"]


async def test_registered_workers_come_with_dynamos_direct_routing_headers(
    store: MemoryStore,
) -> None:
    big = 2**64 - 5  # instance ids are u64 lease ids
    for worker, instance_id in ((LLAMA, big), (LLAMA_1, big)):
        await store.register_instance(
            DynamoInstance(
                instance_id, worker.dp_rank, worker.pod, "llama", "default", 16, "tcp://h:1"
            )
        )
    async with client_for(create_app(store)) as client:
        ranked = await route(client, {"session_id": "s", "limit": 4})

    headers = {(r["pod"], r["dp_rank"]): r["dynamo_headers"] for r in ranked["ranking"]}
    assert headers == {
        ("anon-0", 0): None,
        ("llama-0", 0): {"x-worker-instance-id": str(big), "x-dp-rank": "0"},
        ("llama-0", 1): {"x-worker-instance-id": str(big), "x-dp-rank": "1"},
        ("qwen-0", 0): None,
    }


async def test_a_hint_with_a_model_names_only_that_models_pods(store: MemoryStore) -> None:
    await store.apply(LLAMA, Batch(1, 2.0, [EntriesStored([4, 5, 6], "GPU", 0, "s")]))
    async with client_for(create_app(store)) as client:

        async def hint(**params: str) -> Any:
            response = await client.get("/v1/sessions/s/hint", params=params)
            assert response.status_code == 200, response.text
            return response.json()

        anyone, qwen, nobody = await hint(), await hint(model="qwen"), await hint(model="x")
        bad = await client.get("/v1/sessions/s/hint", params={"model": ""})

    assert anyone["pod"] == "llama-0"  # holds 6 blocks of the session, the others 3
    assert (qwen["pod"], qwen["dp_rank"]) == ("qwen-0", 0)
    assert nobody["pod"] is None and nobody["headers"] == {}
    assert bad.status_code == 400 and "model" in bad.json()["detail"]
