"""`GET /v1/sessions/{id}/hint` (issue #9, item 1): the x-session-token llm-d's endpoint
picker reads names the pod holding most of the session, on every store backend; the naming
follows the settings; bad input is a 400 saying what; the route is guarded like every /v1."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import ValidationError

from kvsi.api import create_app
from kvsi.api.routers.llm_d.hints import HintOptions
from kvsi.serve import hint_options
from kvsi.settings import LlmDConfig, load_settings
from kvsi.store.base import IndexStore
from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    WorkerKey,
    WorkerState,
    WorkerStatus,
)
from tests.api.harness import client_for, get_json
from tests.conformance.conftest import StoreFactory, make_store  # noqa: F401  (fixture)
from tests.redis_servers import redis_cluster, redis_server  # noqa: F401  (fixtures)

A = WorkerKey("pod-a", 0)
A1 = WorkerKey("pod-a", 1)
B = WorkerKey("pod-b", 0)
LLM = HintOptions(namespace="llm")


def epp_session_affinity(headers: Mapping[str, str], endpoints: list[str]) -> dict[str, float]:
    """What llm-d's session-affinity-scorer (encoded_endpoint_header) gives each candidate
    endpoint, as its README and code describe it: 1 where the standard-base64-decoded
    x-session-token equals the endpoint's "<namespace>/<name>", 0 elsewhere."""
    named = base64.b64decode(headers.get("x-session-token", ""), validate=True).decode()
    return {endpoint: float(endpoint == named) for endpoint in endpoints}


@pytest.fixture
async def any_store(make_store: StoreFactory) -> IndexStore:  # noqa: F811
    return await make_store()


async def stored(store: IndexStore, worker: WorkerKey, seq: int, *events: Any) -> None:
    await store.set_status(worker, WorkerStatus(WorkerState.LIVE, 1.0))
    await store.apply(worker, Batch(seq, 1.0, list(events)))


async def test_the_token_names_the_pod_holding_most_of_the_session_on_every_store(
    any_store: IndexStore,
) -> None:
    store = any_store
    await stored(store, A, 0, EntriesStored([1, 2], "GPU", 0, "s"))
    await stored(store, B, 0, EntriesStored([1, 2, 3, 4, 5], "GPU", 0, "s"))
    endpoints = ["llm/pod-a-rank-0", "llm/pod-b-rank-0"]
    async with client_for(create_app(store, hint_options=LLM)) as client:
        hint = await get_json(client, "/v1/sessions/s/hint?format=llm-d")
        assert hint == {
            "session_id": "s",
            "format": "llm-d",
            "pod": "pod-b",
            "dp_rank": 0,
            "target": "llm/pod-b-rank-0",
            "headers": {"x-session-token": base64.b64encode(b"llm/pod-b-rank-0").decode()},
            "session_blocks": 5,
            "state": "live",
        }
        assert epp_session_affinity(hint["headers"], endpoints) == {
            "llm/pod-a-rank-0": 0.0,
            "llm/pod-b-rank-0": 1.0,
        }
        await store.apply(B, Batch(1, 2.0, [EntriesRemoved([1, 2, 3, 4], "GPU", 0)]))
        after = await get_json(client, "/v1/sessions/s/hint")
    assert after["target"] == "llm/pod-a-rank-0"
    assert epp_session_affinity(after["headers"], endpoints)["llm/pod-a-rank-0"] == 1.0


async def test_media_weigh_as_in_the_route_and_disconnected_holders_do_not_count() -> None:
    store = MemoryStore()
    await stored(store, A, 0, EntriesStored([1, 2, 3], "CPU", 0, "s"))  # 3 x 0.8
    await stored(store, B, 0, EntriesStored([1, 2], "GPU", 0, "s"))  # 2 x 1.0
    async with client_for(create_app(store)) as client:
        assert (await get_json(client, "/v1/sessions/s/hint"))["pod"] == "pod-a"
        await store.set_status(A, WorkerStatus(WorkerState.DISCONNECTED, 2.0))
        assert (await get_json(client, "/v1/sessions/s/hint"))["pod"] == "pod-b"
        await store.set_status(B, WorkerStatus(WorkerState.DISCONNECTED, 2.0))
        none = await get_json(client, "/v1/sessions/s/hint")
    assert none["headers"] == {} and none["pod"] is None and none["target"] is None


async def test_a_session_whose_blocks_were_all_evicted_has_no_hint_and_an_unknown_one_is_404() -> (
    None
):
    store = MemoryStore()
    await stored(store, A, 0, EntriesStored([1, 2], "GPU", 0, "s"))
    await store.apply(A, Batch(1, 2.0, [EntriesRemoved([1, 2], "GPU", 0)]))
    async with client_for(create_app(store)) as client:
        evicted = await get_json(client, "/v1/sessions/s/hint")
        unknown = await get_json(client, "/v1/sessions/nope/hint", status=404)
    assert (evicted["headers"], evicted["session_blocks"]) == ({}, 0)
    assert unknown == {"detail": "session 'nope' not found (never seen, or aged out)"}


async def test_without_rank_in_the_template_a_pod_is_ranked_on_all_its_ranks() -> None:
    store = MemoryStore()
    await stored(store, A, 0, EntriesStored([1, 2], "GPU", 0, "s"))
    await store.set_status(A1, WorkerStatus(WorkerState.DEGRADED, 1.0, "gap"))
    await store.apply(A1, Batch(0, 1.0, [EntriesStored([3, 4], "GPU", 0, "s")]))
    await stored(store, B, 0, EntriesStored([1, 2, 3], "GPU", 0, "s"))
    per_rank = create_app(store, hint_options=LLM)
    per_pod = create_app(store, hint_options=HintOptions(namespace="llm", endpoint="{pod}-rank-0"))
    async with client_for(per_rank) as client:
        worker = await get_json(client, "/v1/sessions/s/hint")
    async with client_for(per_pod) as client:
        pod = await get_json(client, "/v1/sessions/s/hint")
    assert (worker["target"], worker["dp_rank"], worker["session_blocks"]) == (
        "llm/pod-b-rank-0",
        0,
        3,
    )
    assert (pod["target"], pod["dp_rank"], pod["session_blocks"], pod["state"]) == (
        "llm/pod-a-rank-0",
        None,
        4,
        "degraded",
    )


async def test_a_pod_is_live_only_if_its_ranks_holding_nothing_are_too() -> None:
    store = MemoryStore()
    await stored(store, A, 0, EntriesStored([1, 2], "GPU", 0, "s"))
    await store.set_status(A1, WorkerStatus(WorkerState.DEGRADED, 1.0, "gap"))
    per_pod = create_app(store, hint_options=HintOptions(namespace="llm", endpoint="{pod}-rank-0"))
    async with client_for(per_pod) as client:
        pod = await get_json(client, "/v1/sessions/s/hint")
    assert (pod["pod"], pod["session_blocks"], pod["state"]) == ("pod-a", 2, "degraded")


async def test_a_label_hint_names_the_pod_and_namespaces_follow_the_longest_prefix() -> None:
    store = MemoryStore()
    await stored(store, WorkerKey("team-a-vllm-0", 0), 0, EntriesStored([1], "GPU", 0, "s"))
    options = HintOptions(namespace="llm", pod_namespaces={"team-": "shared", "team-a-": "team-a"})
    async with client_for(create_app(store, hint_options=options)) as client:
        label = await get_json(client, "/v1/sessions/s/hint?format=label")
        token = await get_json(client, "/v1/sessions/s/hint?format=llm-d")
    assert (label["headers"], label["target"], label["dp_rank"]) == (
        {"x-kvsi-pod": "team-a-vllm-0"},
        "team-a-vllm-0",
        None,
    )
    assert token["target"] == "team-a/team-a-vllm-0-rank-0"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("/v1/sessions/s/hint?format=nginx", "query parameter 'format'"),
        ("/v1/sessions/s/hint?fromat=llm-d", "unknown query parameter 'fromat'"),
        ("/v1/sessions/a%20b/hint", "path parameter 'session_id'"),
    ],
)
async def test_bad_parameters_are_a_400_naming_them(url: str, message: str) -> None:
    async with client_for(create_app(MemoryStore())) as client:
        answer = await get_json(client, url, status=400)
    assert message in answer["detail"]


async def test_the_hint_needs_a_token_when_tokens_are_set() -> None:
    store = MemoryStore()
    await stored(store, A, 0, EntriesStored([1], "GPU", 0, "s"))
    async with client_for(create_app(store, tokens=["t0k3n"])) as client:
        missing = await client.get("/v1/sessions/s/hint")
        right = await client.get("/v1/sessions/s/hint", headers={"Authorization": "Bearer t0k3n"})
        spec = (await client.get("/openapi.json")).json()
    assert missing.status_code == 401
    assert right.status_code == 200 and right.json()["pod"] == "pod-a"
    assert spec["paths"]["/v1/sessions/{session_id}/hint"]["get"]["security"] == [
        {"HTTPBearer": []}
    ]


def test_the_settings_name_endpoints_and_reject_templates_that_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KVSI_LLM_D__NAMESPACE", "llm")
    monkeypatch.setenv("KVSI_LLM_D__ENDPOINT", "{pod}-rank-0")
    monkeypatch.setenv("KVSI_LLM_D__POD_NAMESPACES", '{"team-a-": "team-a"}')
    options = hint_options(load_settings(None))
    assert options == HintOptions(
        namespace="llm", pod_namespaces={"team-a-": "team-a"}, endpoint="{pod}-rank-0"
    )
    assert options.per_pod("llm-d")
    for bad, why in [
        ("{rank}", "must use {pod}"),
        ("{pod}-{node}", "must use {pod}"),
        ("{pod}/{rank}", "must make a Kubernetes name"),
        ("{pod!r}", "must make a Kubernetes name"),
        ("{pod}-{", "is not a template"),
        ("{pod}-{rank:s}", "cannot be formatted"),
    ]:
        with pytest.raises(ValidationError, match=why.replace("{", r"\{")):
            LlmDConfig(endpoint=bad)
    with pytest.raises(ValidationError, match="namespace"):
        LlmDConfig(namespace="Not_A_Namespace")


async def test_the_route_adds_the_hint_of_its_first_worker_when_asked() -> None:
    store = MemoryStore()
    await stored(store, A, 0, EntriesStored([1, 2, 3], "GPU", 0, "s"))
    await stored(store, B, 0, EntriesStored([7, 8], "GPU", 0, None))
    async with client_for(create_app(store, hint_options=LLM)) as client:
        session = (await client.post("/v1/route", json={"session_id": "s", "hint": "llm-d"})).json()
        prompt = (
            await client.post("/v1/route", json={"block_hashes": ["7", "8"], "hint": "label"})
        ).json()
        unasked = (await client.post("/v1/route", json={"session_id": "s"})).json()
        nothing = (
            await client.post("/v1/route", json={"block_hashes": ["99"], "hint": "llm-d"})
        ).json()
        bad = await client.post("/v1/route", json={"session_id": "s", "hint": "nginx"})
    assert session["ranking"][0]["pod"] == "pod-a"
    assert epp_session_affinity(session["hint"]["headers"], ["llm/pod-a-rank-0"]) == {
        "llm/pod-a-rank-0": 1.0
    }
    assert (session["hint"]["target"], session["hint"]["session_blocks"]) == ("llm/pod-a-rank-0", 3)
    assert prompt["hint"]["headers"] == {"x-kvsi-pod": "pod-b"}
    assert unasked["hint"] is None and nothing["hint"] is None
    assert bad.status_code == 400 and "body field 'hint'" in bad.json()["detail"]
