"""Upstream's request and answer rules, checked against `python -m dynamo.indexer` itself:
the same requests, in the same order, to Dynamo's indexer and to kvsi's Dynamo API get the
same status codes, the same bodies where they succeed, and leave the same registrations.

Differences by design (docs/routers/dynamo.md, "Differences"): kvsi's error bodies are
always `{"error": ...}` JSON (Dynamo answers a 422 in plain text); `/query_by_hash` also
takes a hash's unsigned form (Dynamo 422s above 2^63); a body is read as JSON whatever its
Content-Type (Dynamo 415s without `application/json`); a zero block size is refused (422).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from kvsi.api.routers.dynamo import create_dynamo_app
from kvsi.store.memory import MemoryStore
from tests.api.harness import client_for
from tests.peers.dynamo import DynamoIndexer

pytestmark = [pytest.mark.e2e, pytest.mark.peers, pytest.mark.timeout(120)]

REG = {"instance_id": 1, "endpoint": "tcp://127.0.0.1:5999", "model_name": "M", "block_size": 16}
U64 = 2**64 - 1

CASES: list[tuple[str, dict[str, Any]]] = [
    ("/register", REG | {"weights": "fp8"}),  # an unknown field: ignored
    ("/register", REG),  # the same rank again
    ("/register", REG | {"dp_rank": 1, "model_name": "N"}),  # the instance under a 2nd model
    ("/register", REG | {"dp_rank": 1, "routing_group": "g"}),  # ... or a 2nd group
    ("/register", REG | {"dp_rank": 2}),  # another rank of it
    ("/register", REG | {"instance_id": 2, "block_size": 32}),  # the group's block size is 16
    ("/register", REG | {"instance_id": 3, "dp_rank": 2**32}),  # dp_rank is a u32
    ("/register", REG | {"instance_id": 3, "dp_rank": 2**32 - 1}),
    ("/register", REG | {"instance_id": 4, "dp_rank": -1}),
    ("/register", REG | {"instance_id": 4, "endpoint": "http://x:1"}),
    ("/register", {"instance_id": 5}),
    ("/register", REG | {"instance_id": U64}),
    ("/register", REG | {"instance_id": U64 + 1}),
    ("/register", REG | {"instance_id": 7, "model_name": ""}),
    ("/query", {"token_ids": [1], "model_name": "M", "tokens": [1]}),
    ("/query", {"token_ids": [-1], "model_name": "M"}),
    ("/query", {"token_ids": [1], "model_name": "Q"}),
    ("/query", {"token_ids": list(range(40)), "model_name": "M", "lora_name": "x"}),
    ("/query", {"token_ids": [1], "model_name": "M", "routing_group": "g"}),
    ("/query_by_hash", {"block_hashes": [-1], "model_name": "M", "cache_salt": "x"}),
    ("/query_by_hash", {"block_hashes": [-1], "model_name": "M", "cache_salt": None}),
    ("/query_by_hash", {"block_hashes": ["1"], "model_name": "M"}),
    (
        "/unregister",
        {"instance_id": 3, "model_name": "M", "routing_group": "default", "dp_rank": 7},
    ),
    ("/unregister", {"instance_id": 1, "model_name": "N"}),
    ("/unregister", {"instance_id": 1, "model_name": "M", "routing_group": "g"}),
    ("/unregister", {"instance_id": 1, "model_name": "M", "dp_rank": 0}),  # every rank
    ("/unregister", {"instance_id": 1, "model_name": "M"}),
    ("/unregister", {"instance_id": 9, "model_name": "M"}),
    ("/unregister", {"model_name": "M"}),
]


def _registrations(listed: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What `/workers` says was registered (not listener states, which differ in time)."""
    return sorted(
        (
            w["instance_id"],
            w["model_name"],
            w["routing_group"],
            w["block_size"],
            sorted(w["endpoints"].items()),
        )
        for w in listed
    )


async def test_the_same_requests_get_the_same_statuses_and_bodies(
    peer: Path, tmp_path: Path
) -> None:
    dynamo = DynamoIndexer(peer, tmp_path, "dynamo", "--threads", "1")
    try:
        async with (
            httpx.AsyncClient(timeout=10.0) as theirs,
            client_for(create_dynamo_app(MemoryStore())) as ours,
        ):
            await dynamo.serving(theirs)
            differ = []
            for path, body in CASES:
                them = await theirs.post(f"{dynamo.url}{path}", json=body)
                us = await ours.post(path, json=body)
                if them.status_code != us.status_code:
                    differ.append(
                        f"{path} {body}: dynamo {them.status_code} {them.text!r}, "
                        f"kvsi {us.status_code} {us.text!r}"
                    )
                elif them.status_code < 300 and them.json() != us.json():
                    differ.append(f"{path} {body}: dynamo {them.text!r}, kvsi {us.text!r}")
                if path == "/register":
                    after_them = _registrations((await theirs.get(f"{dynamo.url}/workers")).json())
                    after_us = _registrations((await ours.get("/workers")).json())
                    if after_them != after_us:
                        differ.append(f"after {body}: dynamo {after_them}, kvsi {after_us}")
            for query in ("?model_name=M&tenant_id=x&other=1", "?model_name=a&model_name=b"):
                them = await theirs.get(f"{dynamo.url}/workers{query}")
                us = await ours.get(f"/workers{query}")
                if them.status_code != us.status_code:
                    differ.append(f"/workers{query}: {them.status_code} vs {us.status_code}")
            assert not differ, "\n".join(differ)
    finally:
        dynamo.stop()
