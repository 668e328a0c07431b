"""Request bodies and the one error wording: JSON whatever the Content-Type says, a bounded
body (413 before it is read whole), every bad input a 400 naming the field in plain words,
on the REST API, `/v1/watch` and the Dynamo API alike. Over the real apps (ASGI)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Message

from kvsi.api import create_app
from kvsi.api.body import DEFAULT_MAX_BODY_BYTES
from kvsi.api.routers.dynamo import create_dynamo_app
from kvsi.api.routers.dynamo.schemas import MAX_TOKENS as DYNAMO_MAX_TOKENS
from kvsi.api.routes.route import MAX_CANDIDATES
from kvsi.api.routes.route import MAX_TOKENS as ROUTE_MAX_TOKENS
from kvsi.settings import Settings
from kvsi.store.memory import MemoryStore
from tests.api.harness import client_for

NOT_OURS = [
    "Extra inputs",
    "after validation",
    "Input should",
    "String should",
    "List should",
    "Field required",
    "Value error",
    "dictionary or object",
    "JSON decode error",
    "pattern",
    "^[",
    "]{",
    "\\x",
]
"""pydantic's internals and raw regexes: what no error sentence may contain."""

REGISTER = {"instance_id": 1, "endpoint": "tcp://h:1", "model_name": "m", "block_size": 16}

BAD = [
    # (method, url, request options, the key of the error, fragments the sentence holds)
    (
        "POST",
        "/v1/route",
        {"json": {"session_id": "s", "hashing": {"foo": 1}}},
        "detail",
        ["body field 'hashing'", "unknown field 'foo'", "allowed: algorithm, block_size"],
    ),
    ("POST", "/v1/route", {"json": {"token_ids": [True]}}, "detail", ["'token_ids[0]'", "integer"]),
    ("POST", "/v1/route", {"json": {"token_ids": ["5"]}}, "detail", ["'token_ids[0]'", "integer"]),
    ("POST", "/v1/route", {"json": {"token_ids": [1.5]}}, "detail", ["'token_ids[0]'"]),
    ("POST", "/v1/route", {"json": {"session_id": "s", "limit": "5"}}, "detail", ["'limit'"]),
    (
        "POST",
        "/v1/route",
        {"json": {"token_ids": [1], "hashing": {"block_size": True}}},
        "detail",
        ["'hashing.block_size'"],
    ),
    (
        "POST",
        "/v1/route",
        {"json": {"session_id": "s", "weights": {"GPU": "1"}}},
        "detail",
        ["'weights.GPU'"],
    ),
    (
        "POST",
        "/v1/route",
        {"json": {"session_id": "s", "surprise": 1}},
        "detail",
        ["body: unknown field 'surprise'", "allowed: block_hashes, candidates"],
    ),
    (
        "POST",
        "/v1/route",
        {"json": {"session_id": "s", "weights": {"gpu": 1}}},
        "detail",
        ["'weights.gpu (key)'", "uppercase medium"],
    ),
    (
        "POST",
        "/v1/route",
        {"json": {"session_id": "a b"}},
        "detail",
        ["body field 'session_id'", "printable ASCII"],
    ),
    ("POST", "/v1/route", {"json": [1]}, "detail", ["body: must be a JSON object"]),
    ("POST", "/v1/route", {"content": b"{bad"}, "detail", ["body: is not valid JSON"]),
    (
        "POST",
        "/v1/route",
        {
            "content": b"session_id=s",
            "headers": {"content-type": "application/x-www-form-urlencoded"},
        },
        "detail",
        ["body: is not valid JSON"],
    ),
    (
        "POST",
        "/v1/route",
        {"json": {"token_ids": [1] * (ROUTE_MAX_TOKENS + 1)}},
        "detail",
        ["body field 'token_ids'", f"at most {ROUTE_MAX_TOKENS} items"],
    ),
    (
        "GET",
        "/v1/watch?session=a%20b",
        {},
        "detail",
        ["query parameter 'session[0]'", "printable ASCII"],
    ),
    ("GET", "/v1/watch?pod=Bad_Pod", {}, "detail", ["'pod[0]'", "Kubernetes name"]),
    (
        "GET",
        "/v1/watch?foo=1",
        {},
        "detail",
        ["unknown query parameter 'foo'", "allowed: pod, session"],
    ),
    (
        "GET",
        "/v1/watch",
        {"headers": {"Last-Event-ID": "1" * 129}},
        "detail",
        ["header 'last-event-id'", "at most 128"],
    ),
    ("GET", "/v1/sessions?limit=abc", {}, "detail", ["query parameter 'limit'", "integer"]),
]


DYNAMO_BAD: list[tuple[str, str, dict[str, Any], str, list[str]]] = [
    (
        "POST",
        "/dynamo/query",
        {"json": {"token_ids": [True], "model_name": "m"}},
        "error",
        ["'token_ids[0]'", "integer"],
    ),
    (
        "POST",
        "/dynamo/query",
        {"json": {"token_ids": ["5"], "model_name": "m"}},
        "error",
        ["'token_ids[0]'", "integer"],
    ),
    ("POST", "/dynamo/query_by_hash", {"json": "x"}, "error", ["body: must be a JSON object"]),
    (
        "POST",
        "/dynamo/query_by_hash",
        {"json": {"block_hashes": [1] * 65_537, "model_name": "m"}},
        "error",
        ["'block_hashes'", "at most 65536 items"],
    ),
    (
        "POST",
        "/dynamo/register",
        {"json": REGISTER | {"pod": "A"}},
        "error",
        ["body field 'pod'", "Kubernetes name"],
    ),
    (
        "POST",
        "/dynamo/register",
        {"json": REGISTER | {"block_size": "16"}},
        "error",
        ["body field 'block_size'"],
    ),
]
"""Bodies Dynamo's serde refuses: a 422 there as here (tests/peers/test_dynamo_rules.py)."""


def served_app(store: MemoryStore, **limits: int) -> FastAPI:
    """The REST API with the Dynamo API mounted under /dynamo, as `kvsi serve` wires them."""
    app = create_app(store, **limits)
    app.mount("/dynamo", create_dynamo_app(store, **limits))
    return app


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with client_for(served_app(MemoryStore())) as c:
        yield c


async def _refused(
    client: httpx.AsyncClient,
    request: tuple[str, str, dict[str, Any]],
    status: int,
    key: str,
    fragments: list[str],
) -> str:
    """Send `request`; its answer is `status` with one `key` saying every fragment. Returns
    what it said."""
    method, url, options = request
    response = await client.request(method, url, **options)
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == [key]
    for fragment in fragments:
        assert fragment in body[key]
    said: str = body[key]
    return said


@pytest.mark.parametrize(
    ("method", "url", "options", "key", "fragments"),
    DYNAMO_BAD,
    ids=[f"{b[1]}-{i}" for i, b in enumerate(DYNAMO_BAD)],
)
async def test_a_dynamo_body_of_the_wrong_shape_is_a_422_naming_the_field(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    options: dict[str, Any],
    key: str,
    fragments: list[str],
) -> None:
    await _refused(client, (method, url, options), 422, key, fragments)


async def test_a_dynamo_body_that_is_not_json_is_a_400(client: httpx.AsyncClient) -> None:
    response = await client.post("/dynamo/query", content=b"[1,")

    assert response.status_code == 400
    assert "body: is not valid JSON" in response.json()["error"]


@pytest.mark.parametrize(
    ("method", "url", "options", "key", "fragments"),
    BAD,
    ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)],
)
async def test_every_bad_input_is_a_400_naming_the_field_in_plain_words(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    options: dict[str, Any],
    key: str,
    fragments: list[str],
) -> None:
    said = await _refused(client, (method, url, options), 400, key, fragments)
    for wording in NOT_OURS:
        assert wording not in said


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/x-www-form-urlencoded",  # curl -d
        "text/plain",
        "application/octet-stream",
        "application/json; charset=utf-8",
    ],
)
async def test_a_json_body_is_read_whatever_its_content_type_says(
    client: httpx.AsyncClient, content_type: str | None
) -> None:
    headers = {} if content_type is None else {"content-type": content_type}

    routed = await client.post("/v1/route", content=b'{"session_id": "s"}', headers=headers)
    queried = await client.post(
        "/dynamo/query_by_hash",
        content=b'{"block_hashes": [1], "model_name": "m"}',
        headers=headers,
    )

    assert routed.status_code == 200, routed.text
    assert queried.status_code == 404 and queried.json()["error"].startswith("no indexer")


@pytest.mark.parametrize(
    "browser",
    [
        {"sec-fetch-site": "cross-site"},
        {"origin": "http://evil.example"},
        {"origin": "null"},
    ],
)
@pytest.mark.parametrize(("path", "key"), [("/v1/route", "detail"), ("/dynamo/register", "error")])
async def test_a_cross_site_body_without_a_json_type_is_refused(
    client: httpx.AsyncClient, browser: dict[str, str], path: str, key: str
) -> None:
    headers = {"content-type": "text/plain"} | browser
    refused = await client.post(path, content=json.dumps(REGISTER).encode(), headers=headers)
    declared = await client.post(path, json=REGISTER, headers=browser)

    assert refused.status_code == 415, refused.text
    assert "cross-site request must send Content-Type: application/json" in refused.json()[key]
    assert declared.status_code != 415, "a JSON type is a CORS-preflighted request: allowed"


@pytest.mark.parametrize("sender", ["same-origin fetch", "same-origin form", "curl"])
async def test_a_same_site_or_non_browser_body_keeps_any_type(
    client: httpx.AsyncClient, sender: str
) -> None:
    origin = f"{client.base_url.scheme}://{client.base_url.netloc.decode()}"
    browser = {
        "same-origin fetch": {"sec-fetch-site": "same-origin"},
        "same-origin form": {"origin": origin},
        "curl": {},
    }[sender]
    headers = {"content-type": "text/plain"} | browser
    response = await client.post("/v1/route", content=b'{"session_id": "s"}', headers=headers)

    assert response.status_code == 200, response.text


async def test_a_legacy_dynamo_field_name_is_still_accepted(client: httpx.AsyncClient) -> None:
    response = await client.post("/dynamo/register", json=REGISTER | {"additionalsalt": "x"})

    assert response.status_code == 201, response.text


async def _refuse_to_read() -> Message:
    raise AssertionError("the app read a body it should have refused unread")


@pytest.mark.parametrize(("path", "key"), [("/v1/route", "detail"), ("/dynamo/query", "error")])
async def test_a_content_length_over_the_limit_is_413_before_a_byte_is_read(
    path: str, key: str
) -> None:
    app = served_app(MemoryStore(), max_body_bytes=1024)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"t"), (b"content-length", b"52428800")],
        "server": ("t", 80),
        "client": ("c", 1),
        "state": {},
    }
    await app(scope, _refuse_to_read, send)

    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"]) == {
        key: "request body is larger than 1024 bytes (setting max_body_bytes)"
    }


@pytest.mark.parametrize(("path", "key"), [("/v1/route", "detail"), ("/dynamo/query", "error")])
async def test_a_chunked_body_is_refused_once_over_the_limit_and_read_no_further(
    path: str, key: str
) -> None:
    pulled = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(100):
            pulled += 1
            yield b" " * 600

    async with client_for(served_app(MemoryStore(), max_body_bytes=1024)) as client:
        response = await client.post(path, content=chunks())

    assert response.status_code == 413
    assert response.json() == {
        key: "request body is larger than 1024 bytes (setting max_body_bytes)"
    }
    assert pulled <= 3


def test_the_default_limit_takes_the_largest_legal_bodies() -> None:
    largest_query = {
        "token_ids": [2**32 - 1] * DYNAMO_MAX_TOKENS,
        "model_name": "m" * 256,
        "routing_group": "g" * 256,
        "lora_name": "l" * 256,
        "cache_salt": "s" * 1024,
        "tenant_id": "t" * 256,
    }
    largest_route = {
        "session_id": "s" * 256,
        "token_ids": [2**32 - 1] * ROUTE_MAX_TOKENS,
        "candidates": [f"{'p' * 253}/1023"] * MAX_CANDIDATES,
        "hashing": {"hash_seed": "h" * 64, "lora_name": "l" * 256, "lora_path": "p" * 1024},
        "model": "m" * 256,
    }

    for body in (largest_query, largest_route):
        assert len(json.dumps(body, separators=(",", ":"))) < DEFAULT_MAX_BODY_BYTES
    assert Settings().max_body_bytes == DEFAULT_MAX_BODY_BYTES


async def test_swagger_ui_is_served_from_the_package(client: httpx.AsyncClient) -> None:
    for docs in ("/docs", "/dynamo/docs"):
        page = await client.get(docs)
        assert page.status_code == 200
        assert "http://" not in page.text.replace("http://t", "") and "https://" not in page.text
        assets = [
            part.split('"')[0]
            for part in page.text.split('src="')[1:] + page.text.split('href="')[1:]
        ]
        assert any(a.endswith(".js") for a in assets) and any(a.endswith(".css") for a in assets)
        for asset in assets:
            answer = await client.get(asset)
            assert answer.status_code == 200, asset
            kind = answer.headers["content-type"]
            if asset.endswith(".js"):
                assert "javascript" in kind and len(answer.content) > 100_000
            elif asset.endswith(".css"):
                assert kind.startswith("text/css")
            else:
                assert kind.startswith("image/")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"session_id": "\xff\xfe"}', "body: is not valid JSON (not UTF-8 text)"),
        (b"[" * 100_000 + b"]" * 100_000, "body: is not valid JSON"),
    ],
)
@pytest.mark.parametrize(("path", "key"), [("/v1/route", "detail"), ("/dynamo/query", "error")])
async def test_a_body_that_cannot_be_decoded_is_worded_like_every_error(
    client: httpx.AsyncClient, body: bytes, says: str, path: str, key: str
) -> None:
    response = await client.post(path, content=body, headers={"content-type": "application/json"})

    assert response.status_code == 400, response.text
    assert response.json()[key].startswith(says)
