"""A whole read of a store for comparing two (the Redis writers' tests and the transport's).

Not a test module: no test module imports another.
"""

from __future__ import annotations

from typing import Any

from kvsi.store.base import IndexStore
from kvsi.store.hashtext import format_hash
from kvsi.store.model import WorkerKey

A = WorkerKey("pod-a", 0)
B = WorkerKey("pod-b", 1)
"""The two workers the Redis writer tests write (`snapshot` reads their fences)."""


async def _pages(fetch: Any, limit: int) -> list[Any]:
    out: list[Any] = []
    cursor = None
    while True:
        page = await fetch(limit=limit, cursor=cursor)
        if page is None:
            return [None]
        out.extend(page.items)
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


async def snapshot(store: IndexStore) -> dict[str, Any]:
    """Everything the read side tells, with times and paging in small pages (ties included)."""
    workers = await store.list_workers()
    out: dict[str, Any] = {
        "workers": [
            (w.pod, w.dp_rank, w.blocks, w.sessions, w.last_seq, w.unconfirmed) for w in workers
        ],
        "fences": [await store.fence(w) for w in (A, B)],
        "losses": sorted((await store.worker_losses()).items()),
    }
    for pod in (None, "pod-a", "pod-b"):
        sessions = await _pages(
            lambda limit, cursor, pod=pod: store.list_sessions(pod=pod, limit=limit, cursor=cursor),
            limit=2,
        )
        out[f"sessions:{pod}"] = [
            (s.session_id, s.blocks, s.workers, s.last_seen) for s in sessions
        ]
    for sid in ("s1", "s2", "s3", "never"):
        view = await store.get_session(sid)
        out[f"view:{sid}"] = view and (
            view.total_blocks,
            view.last_seen,
            [
                (
                    w.pod,
                    w.dp_rank,
                    w.blocks,
                    w.by_medium,
                    w.last_seen,
                    w.lost_blocks,
                    w.reprefill_tokens,
                    w.frontier,
                )
                for w in view.workers
            ],
        )
        for pod in (None, "pod-b"):
            for medium in (None, "CPU"):
                hashes = await _pages(
                    lambda limit, cursor, sid=sid, pod=pod, medium=medium: store.session_blocks(
                        sid, pod=pod, medium=medium, limit=limit, cursor=cursor
                    ),
                    limit=3,
                )
                out[f"blocks:{sid}:{pod}:{medium}"] = [h and format_hash(h) for h in hashes]
    for pod, rank in (("pod-a", None), ("pod-b", 1), ("pod-b", 0)):
        hashes = await _pages(
            lambda limit, cursor, pod=pod, rank=rank: store.worker_blocks(
                pod, dp_rank=rank, medium=None, limit=limit, cursor=cursor
            ),
            limit=4,
        )
        out[f"pod:{pod}:{rank}"] = [h and format_hash(h) for h in hashes]
    return out
