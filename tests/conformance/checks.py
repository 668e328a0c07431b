"""What the conformance tests (and the Redis writer's) share: reading a store whole, applying
a batch twice, random store events.

Not a test module: the helpers live here so no test module imports another.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvsi.store.base import IndexStore
from kvsi.store.hashtext import format_hash
from kvsi.store.model import (
    ApplyOutcome,
    Batch,
    EntriesRemoved,
    EntriesStored,
    WorkerCleared,
    WorkerKey,
)


async def all_pages(fetch: Any, limit: int = 3) -> list[str]:
    """Walk every page of a hash listing; each hash must come exactly once."""
    out: list[str] = []
    cursor = None
    while True:
        page = await fetch(limit=limit, cursor=cursor)
        assert page is not None
        assert len(page.items) <= limit
        out.extend(format_hash(h) for h in page.items)
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


async def dump(store: IndexStore) -> dict[str, Any]:
    """Everything the read side can tell, to compare stores or before/after a replay."""
    workers = await store.list_workers()
    sessions = []
    cursor = None
    while True:
        page = await store.list_sessions(pod=None, limit=50, cursor=cursor)
        sessions.extend(page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    out: dict[str, Any] = {
        "workers": [(w.pod, w.dp_rank, w.blocks, w.sessions, w.last_seq) for w in workers],
        "sessions": {},
    }
    for s in sessions:
        view = await store.get_session(s.session_id)
        assert view is not None
        out["sessions"][s.session_id] = (
            view.total_blocks,
            [
                (w.pod, w.dp_rank, w.blocks, w.by_medium, w.lost_blocks, w.frontier)
                for w in view.workers
            ],
        )
    for w in workers:
        out[f"blocks:{w.pod}/{w.dp_rank}"] = sorted(
            await all_pages(
                lambda limit, cursor, w=w: store.worker_blocks(
                    w.pod, dp_rank=w.dp_rank, medium=None, limit=limit, cursor=cursor
                ),
                limit=97,
            )
        )
    return out


async def apply_twice(store: IndexStore, worker: WorkerKey, batch: Batch) -> ApplyOutcome:
    """Apply, then replay the same batch: the replay must change nothing."""
    outcome = await store.apply(worker, batch)
    before = await dump(store)
    assert await store.apply(worker, batch) is ApplyOutcome.DUPLICATE
    assert await dump(store) == before
    return outcome


hashes = st.one_of(
    st.integers(min_value=0, max_value=12).map(lambda i: (2**64 - 1 - i) if i % 2 else i),
    st.sampled_from([bytes([i]) * 32 for i in range(3)]),
)
events = st.one_of(
    st.builds(
        EntriesStored,
        st.lists(hashes, min_size=1, max_size=5),
        st.sampled_from(["GPU", "CPU", None]),
        st.sampled_from([0, 1, None]),
        st.sampled_from(["s1", "s2", "s3", None]),
        parent_block_hash=st.one_of(st.none(), hashes),
        block_size=st.sampled_from([None, 16, 32]),
    ),
    st.builds(
        EntriesRemoved,
        st.lists(hashes, min_size=1, max_size=5),
        st.sampled_from(["GPU", "CPU", None]),
        st.sampled_from([0, 1, None]),
    ),
    st.just(WorkerCleared()),
)
