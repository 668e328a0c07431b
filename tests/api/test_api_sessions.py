"""Session endpoints over a real MemoryStore: residency numbers, states, 404s, paging."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import httpx
import pytest

from kvsi.store.hashtext import format_hash
from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    WorkerCleared,
    WorkerKey,
    WorkerState,
    WorkerStatus,
)
from tests.api.harness import (
    BIG,
    DIGESTS,
    Feed,
    client_over,
    collect_pages,
    get_json,
    hash_numbers_in,
)

A = WorkerKey("vllm-0", 0)
B = WorkerKey("vllm-1", 0)
B1 = WorkerKey("vllm-1", 1)


async def test_session_view_counts_residency_per_worker_and_medium(
    client: httpx.AsyncClient, feed: Feed, store: MemoryStore
) -> None:
    await feed(
        A,
        100.0,
        EntriesStored([1, 2, 3], session_id="sess-A"),
        EntriesStored([4], medium="CPU", session_id="sess-A"),
    )
    # Evicting 2 from GPU removes it; evicting 1 from CPU (where it never was) does not.
    await feed(A, 101.0, EntriesRemoved([2]), EntriesRemoved([1], medium="CPU"))
    await feed(B, 102.0, EntriesStored([10, 11], session_id="sess-A"), WorkerCleared())
    await feed(B, 103.0, EntriesStored([12], session_id="sess-A"))
    await store.set_status(B, WorkerStatus(state=WorkerState.DEGRADED, since=5.0, detail="gap"))

    body = await get_json(client, "/v1/sessions/sess-A")

    assert body == {
        "session_id": "sess-A",
        "total_blocks": 4,
        "last_seen": 103.0,
        "pods": [
            {
                "pod": "vllm-0",
                "dp_rank": 0,
                "blocks": 3,
                "by_medium": {"GPU": 2, "CPU": 1},
                "last_seen": 100.0,
                "state": "connecting",
                "lost_blocks": 1,
                "reprefill_tokens": None,  # no block size in these events
                "frontier": {"block_hash": "4", "position": 0},
            },
            {
                "pod": "vllm-1",
                "dp_rank": 0,
                "blocks": 1,
                "by_medium": {"GPU": 1},
                "last_seen": 103.0,
                "state": "degraded",
                "lost_blocks": 0,  # the clear took 2, the store after it reset the count
                "reprefill_tokens": None,
                "frontier": {"block_hash": "12", "position": 0},
            },
        ],
    }


async def test_session_with_every_block_evicted_is_found_with_zero_blocks(
    client: httpx.AsyncClient, feed: Feed
) -> None:
    await feed(A, 100.0, EntriesStored([1, 2], session_id="s", block_size=16))
    await feed(A, 101.0, EntriesRemoved([1, 2]))

    body = await get_json(client, "/v1/sessions/s")

    assert (body["total_blocks"], body["last_seen"]) == (0, 100.0)
    # The worker that lost it all is still listed: what a next turn there prefills again.
    (pod,) = body["pods"]
    assert (pod["pod"], pod["blocks"], pod["by_medium"]) == ("vllm-0", 0, {})
    assert (pod["lost_blocks"], pod["reprefill_tokens"]) == (2, 32)
    assert pod["frontier"] == {"block_hash": "2", "position": 1}


async def test_session_state_is_null_for_a_worker_removed_while_the_request_ran() -> None:
    class WorkerGone(MemoryStore):
        async def worker_states(self) -> dict[WorkerKey, WorkerState]:
            return {}

    store = WorkerGone()
    await store.apply(A, Batch(seq=1, ts=1.0, events=[EntriesStored([1], session_id="s")]))

    async with client_over(store) as client:
        body = await get_json(client, "/v1/sessions/s")

    assert body["pods"][0]["state"] is None


async def test_unknown_session_is_404_with_its_id_in_the_detail(
    client: httpx.AsyncClient, feed: Feed
) -> None:
    await feed(A, 1.0, EntriesStored([1], session_id="known"))

    for url in ("/v1/sessions/nobody", "/v1/sessions/nobody/blocks"):
        body = await get_json(client, url, status=404)
        assert body == {"detail": "session 'nobody' not found (never seen, or aged out)"}


async def test_typical_session_ids_are_accepted(client: httpx.AsyncClient, feed: Feed) -> None:
    ids = ["sess-A", "3f2b8c1e-9d4a-4e0b-8f6a-2c1d0e9b7a65", "user:42@tenant+x=y", "a.b_c~!*"]
    for sid in ids:
        await feed(A, 1.0, EntriesStored([1], session_id=sid))

    for sid in ids:
        body = await get_json(client, f"/v1/sessions/{sid}")
        assert body["session_id"] == sid


async def test_session_blocks_page_through_every_hash_exactly_once_as_strings(
    client: httpx.AsyncClient, feed: Feed
) -> None:
    # Overlapping stores on two workers: the session's distinct hashes, each once.
    await feed(A, 1.0, EntriesStored([*BIG[:200], *DIGESTS[:40]], session_id="big"))
    await feed(B, 2.0, EntriesStored([*BIG[150:], *DIGESTS[20:]], session_id="big"))
    await feed(B, 3.0, EntriesStored([*BIG, *DIGESTS], session_id="other"))
    expected = [format_hash(h) for h in sorted(BIG)] + [format_hash(d) for d in sorted(DIGESTS)]

    hashes, pages = await collect_pages(client, "/v1/sessions/big/blocks", "block_hashes", 7)

    assert hashes == expected  # ints numerically first, then digests, no repeats
    assert pages == -(-len(expected) // 7)
    assert all(isinstance(h, str) for h in hashes)
    assert hashes[0] == str(min(BIG)) and hashes[-1] == "0x" + "3b" * 32


async def test_session_blocks_filter_by_pod_and_medium(
    client: httpx.AsyncClient, feed: Feed
) -> None:
    await feed(A, 1.0, EntriesStored([1, 2], session_id="s"))
    await feed(A, 2.0, EntriesStored([3], medium="CPU", session_id="s"))
    await feed(B1, 3.0, EntriesStored([4], medium="CPU", session_id="s"))

    on_a = await get_json(client, "/v1/sessions/s/blocks?pod=vllm-0")
    cpu = await get_json(client, "/v1/sessions/s/blocks?medium=CPU")
    cpu_b = await get_json(client, "/v1/sessions/s/blocks?pod=vllm-1&medium=CPU")
    disk = await get_json(client, "/v1/sessions/s/blocks?medium=DISK")

    assert on_a == {"block_hashes": ["1", "2", "3"], "next_cursor": None}
    assert cpu["block_hashes"] == ["3", "4"]
    assert cpu_b["block_hashes"] == ["4"]
    assert disk == {"block_hashes": [], "next_cursor": None}


async def test_block_hashes_are_never_json_numbers(client: httpx.AsyncClient, feed: Feed) -> None:
    await feed(A, 1.0, EntriesStored([*BIG[:50]], session_id="s"))

    for url in ("/v1/sessions/s/blocks?limit=10", "/v1/pods/vllm-0/blocks?limit=10"):
        response = await client.get(url)
        body = response.json()
        assert len(body["block_hashes"]) == 10
        assert hash_numbers_in(response.text) == []
        assert f'"{BIG[49]}"' in response.text  # the smallest, quoted


async def test_session_list_pages_most_recent_first_each_once(
    client: httpx.AsyncClient, feed: Feed
) -> None:
    for i in range(23):
        # Pairs share a timestamp: ties are broken by session id, and paging must not skip.
        await feed(A, float(i // 2), EntriesStored([i], session_id=f"s{i:02d}"))
    await feed(B, 50.0, EntriesStored([100, 101], session_id="s00"))

    sessions, pages = await collect_pages(client, "/v1/sessions", "sessions", 4)

    ids = [s["session_id"] for s in sessions]
    assert len(ids) == len(set(ids)) == 23
    assert pages == 6
    assert sessions[0] == {"session_id": "s00", "blocks": 3, "pods": 2, "last_seen": 50.0}
    seen = [s["last_seen"] for s in sessions]
    assert seen == sorted(seen, reverse=True)
    assert ids[1:6] == ["s22", "s20", "s21", "s18", "s19"]  # ties by session id


async def test_session_list_filtered_by_pod_counts_only_that_pod(
    client: httpx.AsyncClient, feed: Feed
) -> None:
    await feed(A, 1.0, EntriesStored([1, 2], session_id="both"))
    await feed(B, 2.0, EntriesStored([3], session_id="both"), EntriesStored([4], session_id="b"))
    await feed(A, 3.0, EntriesStored([5], session_id="a-only"))

    body = await get_json(client, "/v1/sessions?pod=vllm-1")

    assert body == {
        "sessions": [
            {"session_id": "b", "blocks": 1, "pods": 1, "last_seen": 2.0},
            {"session_id": "both", "blocks": 1, "pods": 1, "last_seen": 2.0},
        ],
        "next_cursor": None,
    }


async def _walk(client: httpx.AsyncClient, params: dict[str, str]) -> list[dict[str, Any]]:
    """Every page of `/v1/sessions?<params>` from the first, following `next_cursor`."""
    out: list[dict[str, Any]] = []
    query = params
    while True:
        page = await get_json(client, "/v1/sessions?" + urlencode(query))
        out.extend(page["sessions"])
        if page["next_cursor"] is None:
            return out
        assert len(page["sessions"]) == int(params["limit"])
        query = params | {"cursor": page["next_cursor"]}


async def test_session_list_by_blocks_pages_most_blocks_first(
    client: httpx.AsyncClient, feed: Feed
) -> None:
    await feed(
        A, 1.0, EntriesStored([1, 2, 3], session_id="big"), EntriesStored([4], session_id="a")
    )
    await feed(B, 2.0, EntriesStored([5, 6], session_id="b"), EntriesStored([7, 8], session_id="c"))
    await feed(B, 3.0, EntriesStored([9], session_id="big"), EntriesStored([10], session_id="gone"))
    await feed(B, 4.0, EntriesRemoved([10]))

    listed = await _walk(client, {"order": "blocks", "limit": "2"})

    assert listed == [
        {"session_id": "big", "blocks": 4, "pods": 2, "last_seen": 3.0},
        {"session_id": "b", "blocks": 2, "pods": 1, "last_seen": 2.0},
        {"session_id": "c", "blocks": 2, "pods": 1, "last_seen": 2.0},
        {"session_id": "a", "blocks": 1, "pods": 1, "last_seen": 1.0},
    ]
    on_b = await _walk(client, {"order": "blocks", "limit": "10", "pod": "vllm-1"})
    assert [(s["session_id"], s["blocks"]) for s in on_b] == [("b", 2), ("c", 2), ("big", 1)]
    # The default order is last seen, and lists the session that holds nothing.
    by_time = await _walk(client, {"limit": "10"})
    assert [s["session_id"] for s in by_time] == ["big", "gone", "b", "c", "a"]


async def test_session_list_by_prefix_in_either_order(
    client: httpx.AsyncClient, feed: Feed
) -> None:
    await feed(A, 1.0, EntriesStored([1], session_id="agent-1"), EntriesStored([2], session_id="x"))
    await feed(A, 2.0, EntriesStored([3, 4], session_id="agent-2"))
    await feed(A, 3.0, EntriesStored([5], session_id="agent-10"))

    by_time = await _walk(client, {"prefix": "agent-1", "limit": "1"})
    by_blocks = await _walk(client, {"prefix": "agent-", "limit": "1", "order": "blocks"})
    exact = await get_json(client, "/v1/sessions?prefix=agent-2")

    assert [s["session_id"] for s in by_time] == ["agent-10", "agent-1"]
    assert [s["session_id"] for s in by_blocks] == ["agent-2", "agent-1", "agent-10"]
    assert [s["session_id"] for s in exact["sessions"]] == ["agent-2"]
    assert (await get_json(client, "/v1/sessions?prefix=nobody"))["sessions"] == []


@pytest.mark.parametrize(
    ("query", "fragments"),
    [
        ("order=size", ["query parameter 'order'", "'last_seen' or 'blocks'", "'size'"]),
        ("order=", ["query parameter 'order'", "'last_seen' or 'blocks'"]),
        ("prefix=", ["query parameter 'prefix'", "at least 1"]),
        ("prefix=a%20b", ["query parameter 'prefix'", "without whitespace", "'a b'"]),
        ("prefix=a%2Fb", ["query parameter 'prefix'", "or '/'", "'a/b'"]),
        ("prefix=caf%C3%A9", ["query parameter 'prefix'", "printable ASCII"]),
        ("prefix=" + "s" * 257, ["query parameter 'prefix'", "at most 256"]),
        ("prefix=a&prefix=b", ["query parameter 'prefix' given more than once"]),
        ("order=blocks&order=blocks", ["query parameter 'order' given more than once"]),
    ],
)
async def test_session_list_order_and_prefix_are_validated(
    client: httpx.AsyncClient, query: str, fragments: list[str]
) -> None:
    body = await get_json(client, f"/v1/sessions?{query}", status=400)

    for fragment in fragments:
        assert fragment in body["detail"]


async def test_a_cursor_of_one_order_is_a_400_in_the_other(
    client: httpx.AsyncClient, feed: Feed
) -> None:
    await feed(A, 1.0, EntriesStored([1], session_id="s1"), EntriesStored([2], session_id="s2"))
    by_time = await get_json(client, "/v1/sessions?limit=1")
    by_blocks = await get_json(client, "/v1/sessions?limit=1&order=blocks")

    for cursor, order, other in [
        (by_time["next_cursor"], "blocks", "last_seen"),
        (by_blocks["next_cursor"], "last_seen", "blocks"),
    ]:
        body = await get_json(
            client, "/v1/sessions?" + urlencode({"order": order, "cursor": cursor}), status=400
        )
        assert f"is from order={other}, not order={order}" in body["detail"]
