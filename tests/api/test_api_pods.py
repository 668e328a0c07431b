"""Pod endpoints over a real MemoryStore: worker list with stream health, pod block pages."""

from __future__ import annotations

import httpx

from kvsi.store.memory import MemoryStore
from kvsi.store.model import EntriesRemoved, EntriesStored, WorkerKey, WorkerState, WorkerStatus
from tests.api.harness import BIG, DIGESTS, Feed, collect_pages, get_json

A0 = WorkerKey("vllm-0", 0)
A1 = WorkerKey("vllm-0", 1)
B0 = WorkerKey("vllm-1", 0)


async def test_pods_list_every_worker_by_pod_then_rank_with_its_health(
    client: httpx.AsyncClient, feed: Feed, store: MemoryStore
) -> None:
    await feed(A1, 1.0, EntriesStored([1, 2, 3], session_id="s"), EntriesRemoved([3]))
    await feed(A1, 2.0, EntriesStored([9], medium="CPU"))
    await feed(A0, 3.0, EntriesStored([1], session_id="s"), EntriesStored([2], session_id="t"))
    await store.set_status(
        A1,
        WorkerStatus(
            state=WorkerState.DEGRADED,
            since=1234.5,
            detail="gap 7..9",
            batches_lost=3,
            model="m",
            gaps=4,
            replays=5,
            restarts=1,
            lag_batches=7,
            lag_seconds=0.25,
        ),
    )
    await store.set_status(B0, WorkerStatus(state=WorkerState.DISCONNECTED, since=99.0))

    pods = (await get_json(client, "/v1/pods"))["pods"]

    assert [(p["pod"], p["dp_rank"]) for p in pods] == [("vllm-0", 0), ("vllm-0", 1), ("vllm-1", 0)]
    a0, a1, b0 = pods
    assert (a0["blocks"], a0["sessions"], a0["last_seq"], a0["state"]) == (2, 2, 1, "connecting")
    assert isinstance(a0["last_event_at"], float)
    assert {k: a1[k] for k in a1 if k != "last_event_at"} == {
        "pod": "vllm-0",
        "dp_rank": 1,
        "blocks": 3,
        "sessions": 1,
        "last_seq": 2,
        "state": "degraded",
        "state_since": 1234.5,
        "state_detail": "gap 7..9",
        "batches_lost": 3,
        "gaps": 4,
        "replays": 5,
        "restarts": 1,
        "lag_batches": 7,
        "lag_seconds": 0.25,
        "model": "m",
    }
    # Registered by its status only: no batch applied yet.
    assert (b0["last_seq"], b0["last_event_at"], b0["blocks"]) == (None, None, 0)
    assert (b0["state"], b0["state_since"]) == ("disconnected", 99.0)


async def test_pods_list_is_empty_before_any_worker(client: httpx.AsyncClient) -> None:
    assert await get_json(client, "/v1/pods") == {"pods": []}


async def test_pod_blocks_page_through_all_ranks_exactly_once(
    client: httpx.AsyncClient, feed: Feed
) -> None:
    await feed(A0, 1.0, EntriesStored([*BIG[:180], *DIGESTS[:30]]))
    await feed(A1, 1.0, EntriesStored([*BIG[100:], *DIGESTS[10:]], medium="CPU"))
    await feed(B0, 1.0, EntriesStored([7, 8]))
    expected = [str(h) for h in sorted(BIG)] + ["0x" + d.hex() for d in sorted(DIGESTS)]

    hashes, _ = await collect_pages(client, "/v1/pods/vllm-0/blocks", "block_hashes", 13)

    assert hashes == expected


async def test_pod_blocks_filter_by_rank_and_medium(client: httpx.AsyncClient, feed: Feed) -> None:
    await feed(A0, 1.0, EntriesStored([1, 2]), EntriesStored([3], medium="CPU"))
    await feed(A1, 1.0, EntriesStored([4], medium="CPU"))

    rank1 = await get_json(client, "/v1/pods/vllm-0/blocks?dp_rank=1")
    cpu = await get_json(client, "/v1/pods/vllm-0/blocks?medium=CPU")
    gpu0 = await get_json(client, "/v1/pods/vllm-0/blocks?dp_rank=0&medium=GPU")

    assert rank1 == {"block_hashes": ["4"], "next_cursor": None}
    assert cpu["block_hashes"] == ["3", "4"]
    assert gpu0["block_hashes"] == ["1", "2"]


async def test_unknown_pod_or_rank_is_404(client: httpx.AsyncClient, feed: Feed) -> None:
    await feed(A0, 1.0, EntriesStored([1]))

    pod = await get_json(client, "/v1/pods/nope/blocks", status=404)
    rank = await get_json(client, "/v1/pods/vllm-0/blocks?dp_rank=5", status=404)

    assert pod == {"detail": "pod 'nope' is not known to the index"}
    assert rank == {"detail": "pod 'vllm-0' dp_rank 5 is not known to the index"}
