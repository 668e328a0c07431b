"""What eviction took from a session, over HTTP: the session view's lost blocks, re-prefill
tokens and frontier (the per-worker gauges: tests/e2e/test_eviction_losses.py)."""

from __future__ import annotations

import httpx

from kvsi.store.model import EntriesRemoved, EntriesStored, WorkerCleared, WorkerKey
from tests.api.harness import DIGESTS, Feed, get_json

A = WorkerKey("vllm-0", 0)
B = WorkerKey("vllm-1", 2)


def prompt(hashes: list[int], session: str, parent: int | None = None) -> EntriesStored:
    return EntriesStored(hashes, session_id=session, parent_block_hash=parent, block_size=16)


async def eviction_wave(feed: Feed) -> None:
    """Two sessions on A, one on B; an eviction wave on A, a cache reset on B."""
    await feed(A, 10.0, prompt([1, 2, 3], "s"), prompt([1, 2, 7], "t"))
    await feed(A, 11.0, prompt([1, 2, 3], "s"), prompt([4, 5], "s", parent=3))
    await feed(B, 11.0, prompt([1, 2], "s"))
    await feed(A, 12.0, EntriesRemoved([5, 4, 3, 7, 99]))
    await feed(B, 13.0, WorkerCleared())


async def test_the_session_view_says_what_eviction_took_per_pod(
    client: httpx.AsyncClient, feed: Feed
) -> None:
    await eviction_wave(feed)

    body = await get_json(client, "/v1/sessions/s")

    pods = {(p["pod"], p["dp_rank"]): p for p in body["pods"]}
    assert body["total_blocks"] == 2
    a, b = pods[("vllm-0", 0)], pods[("vllm-1", 2)]
    assert (a["blocks"], a["lost_blocks"], a["reprefill_tokens"]) == (2, 3, 48)
    assert a["frontier"] == {"block_hash": "5", "position": 4}
    assert (b["blocks"], b["lost_blocks"], b["reprefill_tokens"]) == (0, 2, 32)
    assert b["frontier"] == {"block_hash": "2", "position": 1}
    t = (await get_json(client, "/v1/sessions/t"))["pods"]
    assert [(p["blocks"], p["lost_blocks"], p["reprefill_tokens"]) for p in t] == [(2, 1, 16)]


async def test_a_digest_frontier_is_a_hex_string(client: httpx.AsyncClient, feed: Feed) -> None:
    store = EntriesStored(DIGESTS[:2], session_id="d", parent_block_hash=DIGESTS[9])
    await feed(A, 1.0, store)

    (pod,) = (await get_json(client, "/v1/sessions/d"))["pods"]

    assert pod["frontier"] == {"block_hash": "0x" + DIGESTS[1].hex(), "position": None}
    assert (pod["lost_blocks"], pod["reprefill_tokens"]) == (0, None)
