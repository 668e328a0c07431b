"""`GET /v1/watch` over real HTTP: every change in order, filters, resume, overflow, reset."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn

from kvsi.api import create_app
from kvsi.store.feed import FeedHub
from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    WorkerKey,
    WorkerState,
    WorkerStatus,
)

A = WorkerKey("pod-a", 0)
B = WorkerKey("pod-b", 0)


class Served:
    def __init__(self, store: MemoryStore, base: str) -> None:
        self.store = store
        self.base = base


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    store = MemoryStore(FeedHub(history=50, queue_size=8))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(store), host="127.0.0.1", port=port, log_config=None)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.02)
    try:
        yield Served(store, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


class Events:
    """Reads Server-Sent Events from one streamed response, across several calls."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()

    async def next(self, count: int, within: float = 5.0) -> list[dict[str, Any]]:
        """The next `count` events (comments skipped), each as {id, event, data}."""
        return await asyncio.wait_for(self._collect(count), within)

    async def _collect(self, count: int) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        current: dict[str, Any] = {}
        while len(events) < count:
            line = await anext(self._lines)
            if line.startswith(":"):
                continue
            if not line:
                if current:
                    events.append(current)
                    current = {}
                continue
            field, _, value = line.partition(": ")
            current[field] = json.loads(value) if field == "data" else value
        return events


async def test_a_watcher_sees_every_change_in_order(served: Served) -> None:
    store = served.store
    async with (
        httpx.AsyncClient(base_url=served.base) as client,
        client.stream("GET", "/v1/watch") as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        await store.set_status(A, WorkerStatus(WorkerState.LIVE, 1.0))
        await store.apply(A, Batch(0, 1.0, [EntriesStored([1, 2], "GPU", 0, "s1")]))
        await store.apply(A, Batch(1, 2.0, [EntriesStored([2, 3], "GPU", 0, "s2")]))
        await store.apply(A, Batch(2, 3.0, [EntriesRemoved([2])]))
        events = await Events(response).next(5)
    assert [e["event"] for e in events] == [
        "worker",
        "residency",
        "residency",
        "residency",
        "residency",
    ]
    assert events[0]["data"]["state"] == "live"
    residency = [
        (e["data"]["session_id"], e["data"]["added"], e["data"]["removed"], e["data"]["blocks"])
        for e in events[1:]
    ]
    assert residency == [("s1", 2, 0, 2), ("s2", 2, 0, 2), ("s1", 0, 1, 1), ("s2", 0, 1, 1)]
    ids = [e["id"] for e in events]
    assert len(set(ids)) == 5


async def test_filters_and_resume_with_last_event_id(served: Served) -> None:
    store = served.store
    await store.apply(A, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s1")]))
    await store.apply(B, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s2")]))
    async with httpx.AsyncClient(base_url=served.base) as client:
        async with client.stream("GET", "/v1/watch", headers={"Last-Event-ID": "1.0"}) as r:
            (resumed,) = await Events(r).next(1)
        assert resumed["data"]["session_id"] == "s2"
        params = {"pod": "pod-b", "session": ["s2", "s9"]}
        async with client.stream("GET", "/v1/watch", params=params) as r:
            await store.apply(A, Batch(1, 2.0, [EntriesStored([5], "GPU", 0, "s2")]))
            await store.apply(B, Batch(1, 2.0, [EntriesStored([6], "GPU", 0, "s1")]))
            await store.apply(B, Batch(2, 3.0, [EntriesStored([7], "GPU", 0, "s2")]))
            (only,) = await Events(r).next(1)
        assert (only["data"]["pod"], only["data"]["session_id"], only["data"]["blocks"]) == (
            "pod-b",
            "s2",
            2,
        )


async def test_a_stale_resume_point_gets_reset_then_live_events(served: Served) -> None:
    async with (
        httpx.AsyncClient(base_url=served.base) as client,
        client.stream("GET", "/v1/watch", headers={"Last-Event-ID": "999.0"}) as r,
    ):
        events = Events(r)
        (reset,) = await events.next(1)
        await served.store.apply(A, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))
        (live,) = await events.next(1)
    assert reset["event"] == "reset" and "999.0" in reset["data"]["detail"]
    assert live["event"] == "residency"


async def test_a_resume_point_ahead_of_the_feed_is_reset_as_ahead_not_old(
    served: Served,
) -> None:
    await served.store.apply(A, Batch(0, 1.0, [EntriesStored([1], "GPU", 0, "s")]))
    async with (
        httpx.AsyncClient(base_url=served.base) as client,
        client.stream("GET", "/v1/watch", headers={"Last-Event-ID": "999.0"}) as r,
    ):
        (reset,) = await Events(r).next(1)

    assert reset["event"] == "reset"
    assert "'999.0' is ahead of this feed" in reset["data"]["detail"]
    assert "older" not in reset["data"]["detail"]


async def test_a_client_that_does_not_read_overflows_and_ingest_goes_on(served: Served) -> None:
    store = served.store
    async with (
        httpx.AsyncClient(base_url=served.base) as client,
        client.stream("GET", "/v1/watch") as r,
    ):
        await asyncio.sleep(0.2)  # subscribed
        for seq in range(40):
            await store.apply(A, Batch(seq, float(seq), [EntriesStored([seq], "GPU", 0, "s")]))
        events = await Events(r).next(9)
    assert [e["event"] for e in events[:8]] == ["residency"] * 8
    assert events[8]["event"] == "overflow"
    view = await store.get_session("s")
    assert view is not None and view.total_blocks == 40


async def test_bad_filters_are_400(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.base) as client:
        response = await client.get("/v1/watch", params={"pod": "Not_A_Pod"})
    assert response.status_code == 400
    assert "pod" in response.json()["detail"]
