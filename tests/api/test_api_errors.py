"""A failing store becomes a logged 503 "index store unavailable", never a 500."""

from __future__ import annotations

import httpx
import pytest
from structlog.testing import capture_logs

from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    Batch,
    EntriesStored,
    Hash,
    Page,
    SessionSummary,
    SessionView,
    WorkerKey,
    WorkerState,
    WorkerView,
)
from kvsi.store.paging import SessionOrder
from tests.api.harness import client_over, get_json


class DownStore(MemoryStore):
    """Every read fails the way redis-py does when the server is gone."""

    async def get_session(self, session_id: str) -> SessionView | None:
        raise ConnectionError("Error 111 connecting to redis:6379. Connection refused.")

    async def session_blocks(
        self,
        session_id: str,
        *,
        pod: str | None,
        medium: str | None,
        limit: int,
        cursor: str | None,
    ) -> Page[Hash] | None:
        raise ConnectionError("Error 111 connecting to redis:6379. Connection refused.")

    async def list_sessions(
        self,
        *,
        pod: str | None,
        limit: int,
        cursor: str | None,
        order: SessionOrder = "last_seen",
        prefix: str | None = None,
    ) -> Page[SessionSummary]:
        raise TimeoutError("Timeout reading from redis:6379")

    async def list_workers(self) -> list[WorkerView]:
        raise ConnectionError("Error 111 connecting to redis:6379. Connection refused.")

    async def worker_blocks(
        self, pod: str, *, dp_rank: int | None, medium: str | None, limit: int, cursor: str | None
    ) -> Page[Hash] | None:
        raise ConnectionError("Error 111 connecting to redis:6379. Connection refused.")


@pytest.mark.parametrize(
    ("url", "detail"),
    [
        ("/v1/sessions/s", "index store unavailable: ConnectionError: Error 111"),
        ("/v1/sessions/s/blocks", "index store unavailable: ConnectionError: Error 111"),
        ("/v1/sessions", "index store unavailable: TimeoutError: Timeout reading"),
        ("/v1/pods", "index store unavailable: ConnectionError: Error 111"),
        ("/v1/pods/vllm-0/blocks", "index store unavailable: ConnectionError: Error 111"),
    ],
)
async def test_store_failure_is_503_and_logged(url: str, detail: str) -> None:
    with capture_logs() as logged:
        async with client_over(DownStore()) as client:
            body = await get_json(client, url, status=503)

    assert body["detail"].startswith(detail)
    [line] = [e for e in logged if e["event"] == "store.call_failed"]
    assert line["error"].startswith(detail.split(": ", 1)[1])
    assert "exc_info" not in line, "one line, not a traceback per request"


async def test_a_programming_error_in_a_store_read_is_logged_with_its_traceback() -> None:
    """Still a 503 (the caller retries later, as for an outage), but the line shows the bug:
    a compiled module's TypeError on a value of the wrong type, say."""

    class Buggy(MemoryStore):
        async def list_workers(self) -> list[WorkerView]:
            raise TypeError("list object expected; got tuple")

    with capture_logs() as logged:
        async with client_over(Buggy()) as client:
            body = await get_json(client, "/v1/pods", status=503)

    assert body["detail"] == "index store unavailable: TypeError: list object expected; got tuple"
    [line] = [e for e in logged if e["event"] == "store.call_failed"]
    assert isinstance(line["exc_info"], TypeError)


async def test_an_outage_logs_one_line_for_many_failed_requests() -> None:
    with capture_logs() as logged:
        async with client_over(DownStore()) as client:
            for _ in range(20):
                await get_json(client, "/v1/pods", status=503)

    [line] = [e for e in logged if e["event"] == "store.call_failed"]
    assert (line["store_method"], line["failed_since_last_line"]) == ("list_workers", 0)


async def test_session_view_is_503_when_the_worker_states_cannot_be_read() -> None:
    class StatesDown(MemoryStore):
        async def worker_states(self) -> dict[WorkerKey, WorkerState]:
            raise ConnectionError("gone")

    store = StatesDown()
    await store.apply(WorkerKey("p", 0), Batch(1, 1.0, [EntriesStored([1], session_id="s")]))
    async with client_over(store) as client:
        body = await get_json(client, "/v1/sessions/s", status=503)

    assert body == {"detail": "index store unavailable: ConnectionError: gone"}


async def test_liveness_does_not_touch_the_store() -> None:
    async with client_over(DownStore()) as client:
        assert await get_json(client, "/healthz") == {"status": "ok"}


async def test_bad_cursor_is_not_logged_as_a_store_failure(client: httpx.AsyncClient) -> None:
    with capture_logs() as logged:
        await get_json(client, "/v1/sessions?cursor=nope", status=400)

    assert [e for e in logged if e["event"] == "store.call_failed"] == []
