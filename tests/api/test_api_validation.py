"""Every bad parameter is a 400 `{"detail": str}` naming the parameter and the rule."""

from __future__ import annotations

import httpx
import pytest

from kvsi.store.model import EntriesStored, WorkerKey
from tests.api.harness import Feed, get_json

CASES = [
    # (url, fragments the detail must contain)
    ("/v1/sessions/" + "s" * 257, ["path parameter 'session_id'", "at most 256"]),
    ("/v1/sessions/a%20b", ["path parameter 'session_id'", "without whitespace", "'a b'"]),
    ("/v1/sessions/caf%C3%A9", ["path parameter 'session_id'", "printable ASCII"]),
    ("/v1/sessions/s/blocks?limit=0", ["query parameter 'limit'", "greater than or equal to 1"]),
    ("/v1/sessions/s/blocks?limit=1001", ["query parameter 'limit'", "less than or equal to 1000"]),
    ("/v1/sessions?limit=abc", ["query parameter 'limit'", "valid integer", "'abc'"]),
    ("/v1/sessions?pod=Vllm_0", ["query parameter 'pod'", "Kubernetes name", "'Vllm_0'"]),
    ("/v1/sessions?pod=", ["query parameter 'pod'", "at least 1"]),
    ("/v1/sessions/s/blocks?medium=gpu", ["query parameter 'medium'", "uppercase medium"]),
    ("/v1/sessions/s/blocks?medium=" + "G" * 33, ["query parameter 'medium'", "up to 31"]),
    ("/v1/sessions/s/blocks?cursor=" + "1" * 513, ["query parameter 'cursor'", "at most 512"]),
    ("/v1/pods/-vllm/blocks", ["path parameter 'pod'", "Kubernetes name"]),
    ("/v1/pods/" + "a" * 254 + "/blocks", ["path parameter 'pod'", "at most 253"]),
    ("/v1/pods/vllm-0/blocks?dp_rank=-1", ["query parameter 'dp_rank'", "greater than or equal"]),
    ("/v1/pods/vllm-0/blocks?dp_rank=one", ["query parameter 'dp_rank'", "valid integer"]),
    (
        "/v1/sessions?pods=vllm-0",
        ["unknown query parameter 'pods'", "allowed: cursor, limit, order, pod, prefix"],
    ),
    (
        "/v1/pods/vllm-0/blocks?rank=1",
        ["unknown query parameter 'rank'", "allowed: cursor, dp_rank, limit, medium"],
    ),
    # A repeated parameter: FastAPI would keep one value silently.
    ("/v1/sessions/s/blocks?limit=1&limit=2", ["query parameter 'limit' given more than once"]),
    ("/v1/pods/vllm-0/blocks?medium=GPU&medium=CPU", ["query parameter 'medium' given more"]),
    ("/v1/sessions/s/hint?format=label&format=llm-d", ["query parameter 'format' given more"]),
]


@pytest.mark.parametrize(("url", "fragments"), CASES, ids=[c[0][:60] for c in CASES])
async def test_bad_parameter_is_400_saying_which_and_why(
    client: httpx.AsyncClient, feed: Feed, url: str, fragments: list[str]
) -> None:
    await feed(WorkerKey("vllm-0", 0), 1.0, EntriesStored([1], session_id="s"))

    body = await get_json(client, url, status=400)

    assert list(body) == ["detail"] and isinstance(body["detail"], str)
    for fragment in fragments:
        assert fragment in body["detail"]


async def test_several_bad_parameters_are_all_reported(client: httpx.AsyncClient) -> None:
    body = await get_json(client, "/v1/pods/Bad/blocks?dp_rank=-1&medium=gpu", status=400)

    for name in ("'pod'", "'dp_rank'", "'medium'"):
        assert name in body["detail"]


@pytest.mark.parametrize(
    ("url", "detail"),
    [
        (
            "/v1/sessions/s/blocks?cursor=zz",
            "cursor 'zz': block hash 'zz' is neither a decimal integer nor 0x-hex",
        ),
        ("/v1/pods/vllm-0/blocks?cursor=0xabc", "cursor '0xabc': hex block hash '0xabc' needs"),
        ("/v1/sessions?cursor=zz", "cursor 'zz' is not a session cursor"),
    ],
)
async def test_cursor_the_store_rejects_is_400_with_its_message(
    client: httpx.AsyncClient, feed: Feed, url: str, detail: str
) -> None:
    await feed(WorkerKey("vllm-0", 0), 1.0, EntriesStored([1], session_id="s"))

    body = await get_json(client, url, status=400)

    assert body["detail"].startswith(detail)


async def test_a_slash_in_a_session_id_never_reaches_a_session(
    client: httpx.AsyncClient, feed: Feed
) -> None:
    await feed(WorkerKey("vllm-0", 0), 1.0, EntriesStored([1], session_id="user:42/x"))

    # Starlette decodes %2F before routing: the id splits and no session route matches.
    response = await client.get("/v1/sessions/user:42%2Fx")

    assert response.status_code == 404
    assert "session_id" not in response.json()
