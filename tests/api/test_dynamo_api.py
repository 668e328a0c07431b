"""The Dynamo standalone-indexer API against Dynamo's own recorded examples: the same request
bodies are accepted and the answers have the documented shapes with the right scores."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from kvsi.api.routers.dynamo import DynamoOptions, create_dynamo_app
from kvsi.hashing.dynamo import tokens_hashes
from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    Batch,
    EntriesStored,
    StoreEvent,
    WorkerKey,
    WorkerState,
    WorkerStatus,
)
from tests.api.harness import client_for
from tests.paths import FIXTURES

DYNAMO = FIXTURES / "dynamo"

POD_1 = WorkerKey("vllm-1", 0)
POD_2 = WorkerKey("vllm-2", 1)
SIGNED = [-(2**63), -1, 123456]
"""Signed 64-bit hashes as Dynamo clients send them; the index keeps their u64 form."""


def recorded(name: str) -> Any:
    return json.loads((DYNAMO / name).read_text())


async def post(client: httpx.AsyncClient, path: str, body: Any, status: int = 200) -> Any:
    response = await client.post(path, json=body)
    assert response.status_code == status, response.text
    return response.json()


async def put(store: MemoryStore, worker: WorkerKey, seq: int, *events: StoreEvent) -> None:
    await store.apply(worker, Batch(seq, float(seq + 1), list(events)))
    await store.set_status(worker, WorkerStatus(WorkerState.LIVE, 1.0))


def registration(instance_id: int, worker: WorkerKey, group: str = "default") -> dict[str, Any]:
    """A recorded /register body naming a kvsi worker (`pod`, kvsi's only extension)."""
    body: dict[str, Any] = recorded("register_requests.json")[0] | {
        "instance_id": instance_id,
        "dp_rank": worker.dp_rank,
        "pod": worker.pod,
        "endpoint": f"tcp://127.0.0.1:{5557 + instance_id}",
    }
    if group != "default":
        body["routing_group"] = group
    return body


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
async def client(store: MemoryStore) -> Any:
    async with client_for(create_dynamo_app(store)) as c:
        yield c


async def register_documented_pair(client: httpx.AsyncClient) -> None:
    """Instances 1 (rank 0) and 2 (rank 1) of llama-3-8b, as in the documented answer."""
    await post(client, "/register", registration(1, POD_1), 201)
    await post(client, "/register", registration(2, POD_2), 201)


def engine(tokens: int) -> int:
    """The engine's hash of the block Dynamo's `tokens` hash names (any injective stand-in)."""
    return (tokens * 31 + 7) % 2**64


def chain(tokens: list[int], medium: str = "GPU", parent: int | None = None) -> EntriesStored:
    """A store of blocks whose Dynamo hashes are `tokens`, after `parent` (engine hash)."""
    return EntriesStored(
        [engine(t) for t in tokens], medium, parent_block_hash=parent, tokens_hashes=tokens
    )


DOCUMENTED = recorded("query_response.json") | {"frequencies": []}
"""The documented answer as Dynamo gives it: only what matched (its instance 2, which
matched nothing, is left out by Dynamo's indexer) and no access counts."""
DOCUMENTED["scores"] = {"1": DOCUMENTED["scores"]["1"]}
DOCUMENTED["instances"] = {"1": DOCUMENTED["instances"]["1"]}


async def test_query_by_hash_answers_the_documented_example_with_signed_hashes(
    client: httpx.AsyncClient, store: MemoryStore
) -> None:
    await register_documented_pair(client)
    u64 = [h & (2**64 - 1) for h in SIGNED]
    await put(store, POD_1, 0, chain(u64[:2]), chain(u64[2:], "CPU", engine(u64[1])))
    await put(store, POD_2, 0, chain(u64[1:]))  # not from the prompt's start: no match
    body = recorded("query_by_hash_request.json") | {"block_hashes": SIGNED}

    answer = await post(client, "/query_by_hash", body)

    assert answer == DOCUMENTED
    assert json.dumps(answer) == json.dumps(DOCUMENTED)  # key order too


async def test_query_by_hash_accepts_the_unsigned_form_of_the_same_hashes(
    client: httpx.AsyncClient, store: MemoryStore
) -> None:
    await register_documented_pair(client)
    u64 = [h & (2**64 - 1) for h in SIGNED]
    await put(store, POD_1, 0, chain(u64))
    body = {"block_hashes": u64, "model_name": "llama-3-8b"}

    answer = await post(client, "/query_by_hash", body)

    assert answer["scores"] == {"1": {"0": 48}}


async def test_the_engines_block_hashes_match_nothing(
    client: httpx.AsyncClient, store: MemoryStore
) -> None:
    await register_documented_pair(client)
    await put(store, POD_1, 0, chain([1, 2]))
    body = {"block_hashes": [engine(1), engine(2)], "model_name": "llama-3-8b"}

    assert await post(client, "/query_by_hash", body) == {
        "scores": {},
        "frequencies": [],
        "instances": {},
    }


async def test_tiers_are_cumulative_as_in_dynamos_multi_rank_summary(
    client: httpx.AsyncClient, store: MemoryStore
) -> None:
    case = recorded("overlap_summary.json")
    workers = {rank: WorkerKey("vllm-7", int(rank)) for rank in case["device_blocks"]}
    for worker in workers.values():
        await post(client, "/register", registration(7, worker) | {"instance_id": 7}, 201)
    prompt = list(range(100, 110))
    for rank, worker in workers.items():
        gpu = case["device_blocks"][rank]
        cpu = gpu + case["host_pinned_extension"].get(rank, 0)
        disk = cpu + case["disk_extension"].get(rank, 0)
        await put(
            store,
            worker,
            0,
            chain(prompt[:gpu]),
            chain(prompt[gpu:cpu], "CPU", engine(prompt[gpu - 1])),
            chain(prompt[cpu:disk], "DISK", engine(prompt[cpu - 1])),
        )

    answer = await post(
        client, "/query_by_hash", {"block_hashes": prompt, "model_name": "llama-3-8b"}
    )

    assert answer["instances"] == {"7": case["summary"]}
    assert answer["scores"] == {"7": case["summary"]["dp"]}


def hashed(tokens: list[int], **keys: str) -> EntriesStored:
    """A store of `tokens` (block size 16) keyed as Dynamo hashes them with `keys`."""
    dynamo = tokens_hashes(tokens, 16, keys.get("lora_name"), keys.get("salt"))
    return chain(dynamo)


async def test_query_hashes_token_ids_as_dynamo_does(
    client: httpx.AsyncClient, store: MemoryStore
) -> None:
    await register_documented_pair(client)
    tokens = list(range(1, 49))  # three blocks of 16
    dynamo = tokens_hashes(tokens, 16)
    await put(store, POD_1, 0, chain(dynamo[:2]), chain(dynamo[2:], "CPU", engine(dynamo[1])))
    body = recorded("query_request.json") | {"token_ids": [*tokens, 7]}  # a partial block

    answer = await post(client, "/query", body)

    assert answer == DOCUMENTED


async def test_a_cache_salt_and_a_lora_name_change_every_hash_of_query(
    client: httpx.AsyncClient, store: MemoryStore
) -> None:
    await register_documented_pair(client)
    tokens = list(range(32))
    await put(store, POD_1, 0, hashed(tokens, salt="tenant-a"))
    await put(store, POD_2, 0, hashed(tokens, lora_name="sql"))
    body = {"token_ids": tokens, "model_name": "llama-3-8b"}

    plain = await post(client, "/query", body)
    with_salt = await post(client, "/query", body | {"cache_salt": "tenant-a"})
    with_lora = await post(client, "/query", body | {"lora_name": "sql"})

    assert plain["scores"] == {}
    assert with_salt["scores"] == {"1": {"0": 32}}
    assert with_lora["scores"] == {"2": {"1": 32}}


async def test_each_routing_group_and_model_answers_for_its_own_workers_only(
    client: httpx.AsyncClient, store: MemoryStore
) -> None:
    await post(client, "/register", registration(1, POD_1), 201)
    await post(client, "/register", registration(2, POD_2, "customer-a"), 201)
    await put(store, POD_1, 0, chain([5]))
    await put(store, POD_2, 0, chain([5]))
    body = {"block_hashes": [5], "model_name": "llama-3-8b"}

    default = await post(client, "/query_by_hash", body)
    group_a = await post(client, "/query_by_hash", body | {"routing_group": "customer-a"})
    other = await post(client, "/query_by_hash", body | {"model_name": "mistral"}, 404)

    assert default["scores"] == {"1": {"0": 16}}
    assert group_a["scores"] == {"2": {"1": 16}}
    assert other == {"error": "no indexer for model=mistral routing_group=default"}


async def test_register_answers_201_and_refuses_what_dynamo_refuses(
    client: httpx.AsyncClient,
) -> None:
    first, second = recorded("register_requests.json")
    assert await post(client, "/register", first, 201) == {"status": "ok"}
    assert await post(client, "/register", second, 201) == {"status": "ok"}

    again = await post(client, "/register", first | {"endpoint": "tcp://10.0.0.9:1"}, 409)
    sizes = await post(client, "/register", first | {"instance_id": 3, "block_size": 32}, 409)
    worker = await post(client, "/register", first | {"instance_id": 4, "pod": "dynamo-1"}, 409)

    assert "instance 1 dp_rank 0 is already registered" in again["error"]
    assert "has block size 16, not 32" in sizes["error"]
    assert "worker dynamo-1/0 already answers for instance 1" in worker["error"]


async def test_workers_lists_registrations_with_their_streams_as_listeners(
    client: httpx.AsyncClient, store: MemoryStore
) -> None:
    documented = recorded("workers_response.json")[0]
    for rank, endpoint in documented["endpoints"].items():
        body = recorded("register_requests.json")[0] | {"dp_rank": int(rank), "endpoint": endpoint}
        await post(client, "/register", body, 201)
    for rank in (0, 1):
        await store.set_status(WorkerKey("dynamo-1", rank), WorkerStatus(WorkerState.LIVE, 1.0))

    listed = (await client.get("/workers")).json()

    assert listed == [documented | {"kvsi_workers": {"0": "dynamo-1/0", "1": "dynamo-1/1"}}]
    await store.set_status(
        WorkerKey("dynamo-1", 1), WorkerStatus(WorkerState.DISCONNECTED, 2.0, "publisher down")
    )
    [worker] = (await client.get("/workers", params={"model_name": "llama-3-8b"})).json()
    assert worker["status"] == "failed"
    assert worker["listeners"]["1"] == {
        "endpoint": "tcp://127.0.0.1:5558",
        "status": "failed",
        "last_error": "publisher down",
    }
    assert (await client.get("/workers", params={"routing_group": "acme"})).json() == []


async def test_unregister_forgets_the_instance_for_that_model(
    client: httpx.AsyncClient,
) -> None:
    await register_documented_pair(client)
    every_group, one_group, one_rank = recorded("unregister_requests.json")

    await post(client, "/unregister", every_group | {"instance_id": 2}, 200)
    missing = await post(client, "/unregister", every_group | {"instance_id": 2}, 404)
    await post(client, "/unregister", one_group, 404)  # instance 1 is in the default group
    assert await post(client, "/unregister", one_rank, 200) == {"status": "ok"}

    assert missing == {"error": "instance 2 is not registered for model 'llama-3-8b'"}
    assert (await client.get("/workers")).json() == []
    body = {"block_hashes": [1], "model_name": "llama-3-8b"}
    assert (await post(client, "/query_by_hash", body, 404))["error"].startswith("no indexer")


async def test_dump_lists_each_block_under_its_parent_with_its_tokens_hash(
    client: httpx.AsyncClient, store: MemoryStore
) -> None:
    await post(client, "/register", registration(1, POD_1), 201)
    await put(
        store,
        POD_1,
        0,
        chain([21], "CPU", engine(12)),  # stored before its parent: listed after it
        chain([11, 12]),
        chain([12], "CPU", engine(11)),
        EntriesStored([bytes(32)], "GPU"),  # no u64 form: left out
        EntriesStored(list(range(40)), "GPU"),  # no tokens (ingested with the API off)
    )

    dumped = (await client.get("/dump")).json()

    [entry] = dumped.values()
    listed = [
        (
            e["storage_tier"],
            e["event"]["data"]["stored"]["parent_hash"],
            [(b["block_hash"], b["tokens_hash"]) for b in e["event"]["data"]["stored"]["blocks"]],
        )
        for e in entry["events"]
    ]
    assert listed == [
        ("device", None, [(engine(11), 11)]),
        ("device", engine(11), [(engine(12), 12)]),
        ("host_pinned", engine(11), [(engine(12), 12)]),
        ("host_pinned", engine(12), [(engine(21), 21)]),
    ]
    assert [e["event"]["event_id"] for e in entry["events"]] == [0, 1, 2, 3]
    assert entry["events"][0]["worker_id"] == 1
    assert entry["truncated"] is False


async def test_dump_stops_at_its_limit_and_says_so(store: MemoryStore) -> None:
    await put(store, POD_1, 0, chain(list(range(10))), chain([99], "CPU", engine(9)))
    await put(store, POD_2, 0, chain([5]))
    async with client_for(create_dynamo_app(store, DynamoOptions(dump_limit=4))) as client:
        await post(client, "/register", registration(1, POD_1), 201)
        await post(client, "/register", registration(2, POD_2, "b"), 201)

        dumped = (await client.get("/dump")).json()

    first = dumped["llama-3-8b:default"]
    assert first["truncated"] is True
    blocks = [e["event"]["data"]["stored"]["blocks"][0]["tokens_hash"] for e in first["events"]]
    assert blocks == [0, 1, 2, 3]
    assert dumped["llama-3-8b:b"] == {"block_size": 16, "events": [], "truncated": True}


async def test_health_is_200_with_nothing_to_say(client: httpx.AsyncClient) -> None:
    response = await client.get("/health")

    assert (response.status_code, response.content) == (200, b"")


CHECKED_BODIES = [
    (
        "/query_by_hash",
        {"block_hashes": [1], "model_name": "m", "cache_salt": ""},
        ["body field 'cache_salt'", "not accepted by /query_by_hash"],
    ),
    (
        "/register",
        {"instance_id": 1, "endpoint": "http://h:1", "model_name": "m", "block_size": 16},
        ["body field 'endpoint'", "must start with tcp://, ipc:// or inproc://"],
    ),
]
"""Values Dynamo's handlers check themselves: a 400 there as here."""

BAD_BODIES = [
    ("/query_by_hash", {"block_hashes": ["1"], "model_name": "m"}, ["'block_hashes[0]'"]),
    ("/query_by_hash", {"block_hashes": [2**64], "model_name": "m"}, ["'block_hashes[0]'"]),
    ("/query_by_hash", {"block_hashes": [1]}, ["body field 'model_name'", "required"]),
    ("/query", {"token_ids": [-1], "model_name": "m"}, ["'token_ids[0]'"]),
    ("/query", {"token_ids": [2**32], "model_name": "m"}, ["'token_ids[0]'"]),
    (
        "/register",
        {"instance_id": -1, "endpoint": "tcp://h:1", "model_name": "m", "block_size": 16},
        ["'instance_id'"],
    ),
    (
        "/register",
        {"instance_id": 1, "endpoint": "tcp://h:1", "model_name": "m", "block_size": 0},
        ["'block_size'"],
    ),
    (
        "/register",
        {
            "instance_id": 1,
            "endpoint": "tcp://h:1",
            "model_name": "m",
            "block_size": 16,
            "pod": "A",
        },
        ["'pod'", "Kubernetes name"],
    ),
    ("/unregister", {"instance_id": 1}, ["'model_name'", "required"]),
]


@pytest.mark.parametrize(
    ("path", "body", "fragments", "status"),
    [(*case, 422) for case in BAD_BODIES] + [(*case, 400) for case in CHECKED_BODIES],
)
async def test_bad_input_is_422_or_400_as_in_dynamo_naming_what_is_wrong(
    client: httpx.AsyncClient, path: str, body: Any, fragments: list[str], status: int
) -> None:
    """Types, ranges and missing fields (what Dynamo's serde refuses) are 422s; a value its
    handlers check, 400 (tests/peers/test_dynamo_rules.py holds both to Dynamo's)."""
    answer = await post(client, path, body, status)

    assert list(answer) == ["error"]
    for fragment in fragments:
        assert fragment in answer["error"]


async def test_a_body_that_is_not_json_is_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/query", content=b"{not json", headers={"content-type": "application/json"}
    )

    assert response.status_code == 400
    assert "JSON" in response.json()["error"]


async def test_an_unknown_workers_filter_is_ignored_as_dynamo_ignores_it(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/workers", params={"model": "m"})

    assert (response.status_code, response.json()) == (200, [])


async def test_tokens_guard_everything_but_health(store: MemoryStore) -> None:
    async with client_for(create_dynamo_app(store, tokens=["t0k"])) as client:
        refused = await client.get("/workers")
        allowed = await client.get("/workers", headers={"Authorization": "Bearer t0k"})
        health = await client.get("/health")

    assert (refused.status_code, list(refused.json())) == (401, ["error"])
    assert (allowed.status_code, health.status_code) == (200, 200)


async def test_unknown_fields_are_ignored_as_dynamo_ignores_them(
    client: httpx.AsyncClient,
) -> None:
    first = recorded("register_requests.json")[0]
    await post(client, "/register", first | {"weights": "fp8"}, 201)
    body = {"token_ids": [1], "model_name": "llama-3-8b", "tokens": [1]}

    assert (await post(client, "/query", body))["scores"] == {}


async def test_a_workers_filter_given_twice_is_400(client: httpx.AsyncClient) -> None:
    response = await client.get("/workers?model_name=a&model_name=b")

    assert response.status_code == 400
    assert response.json() == {"error": "query parameter 'model_name' given more than once"}
