"""A route, a session view and a hint read the fleet's states once per change, not once per
request: what they derive from every worker (the connected ones, in rank order, by pod) is
kept while the store answers the same states mapping (api/candidates.py)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from kvsi.api import create_app
from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, EntriesStored, WorkerKey, WorkerState, WorkerStatus
from tests.api.harness import client_for, get_json

WORKERS = 2_000
HOLDER = WorkerKey("vllm-1234", 1)
REQUESTS = 30


class CountedStates(dict[WorkerKey, WorkerState]):
    """A states mapping counting the walks over it."""

    walks = 0

    def __iter__(self) -> Iterator[WorkerKey]:
        type(self).walks += 1
        return super().__iter__()

    def items(self) -> Any:
        type(self).walks += 1
        return super().items()

    def values(self) -> Any:
        type(self).walks += 1
        return super().values()


class CountingStore(MemoryStore):
    """The memory store answering its states through `CountedStates`, made anew only when
    the store's own mapping changes (as every store does)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: tuple[Mapping[WorkerKey, WorkerState], CountedStates] | None = None

    async def worker_states(self) -> Mapping[WorkerKey, WorkerState]:
        states = await super().worker_states()
        if self._seen is None or self._seen[0] is not states:
            self._seen = (states, CountedStates(states))
        return self._seen[1]


@pytest.fixture
async def fleet() -> CountingStore:
    store = CountingStore()
    for i in range(WORKERS // 2):
        for rank in (0, 1):
            await store.set_status(
                WorkerKey(f"vllm-{i}", rank), WorkerStatus(WorkerState.LIVE, 1.0)
            )
    await store.apply(HOLDER, Batch(0, 1.0, [EntriesStored([1, 2, 3], "GPU", 0, "s")]))
    return store


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/route", {"session_id": "s", "block_hashes": ["1", "2", "9"]}),
        ("POST", "/v1/route", {"session_id": "s", "hint": "label"}),
        ("GET", "/v1/sessions/s", None),
        ("GET", "/v1/sessions/s/hint", None),
        ("GET", "/v1/sessions/s/hint?format=label", None),
    ],
)
async def test_requests_do_not_walk_the_fleet(
    fleet: CountingStore, method: str, path: str, body: dict[str, Any] | None
) -> None:
    CountedStates.walks = 0
    async with client_for(create_app(fleet)) as client:
        for _ in range(REQUESTS):
            answer = await client.request(method, path, json=body)
            assert answer.status_code == 200, answer.text
            text = answer.text
    assert "vllm-1234" in text, "the holder is found"
    assert CountedStates.walks <= 2, "once per states mapping, not per request"


async def test_a_state_change_is_seen_by_the_next_request(fleet: CountingStore) -> None:
    async with client_for(create_app(fleet)) as client:
        first = await get_json(client, "/v1/sessions/s/hint")
        await fleet.set_status(HOLDER, WorkerStatus(WorkerState.DISCONNECTED, 2.0))
        gone = await get_json(client, "/v1/sessions/s/hint")
        routed = await client.post("/v1/route", json={"session_id": "s", "limit": 1})
    assert first["pod"] == "vllm-1234" and gone["pod"] is None
    assert routed.json()["ranking"][0]["pod"] == "vllm-0", "the holder is no candidate now"
