"""Reads at once, and reads given up, answer as reads one by one (run once per backend).

A backend may share connections between concurrent reads (the Redis store holds a few for
its read scripts): each answer must still be its own, and a read cancelled halfway must not
leave anything behind that a later read would take for its answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from kvsi.store.base import IndexStore
from kvsi.store.model import Batch, EntriesStored, Hash, StoreEvent, WorkerKey

WORKERS = [WorkerKey("pod-a", 0), WorkerKey("pod-b", 0), WorkerKey("pod-b", 1)]
SESSIONS = 12


def chain(session: int) -> list[Hash]:
    """The session's prompt: blocks no other session shares, the first one included."""
    return [1000 * (session + 1) + i for i in range(1 + session % 4)]


async def filled(store: IndexStore) -> IndexStore:
    """Each session on one worker (its GPU), half of them on a second one too (its CPU)."""
    for i, worker in enumerate(WORKERS):
        events: list[StoreEvent] = [
            EntriesStored(chain(s), "GPU" if s % len(WORKERS) == i else "CPU", 0, f"s{s}")
            for s in range(SESSIONS)
            if s % len(WORKERS) == i or (s % 2 and (s + 1) % len(WORKERS) == i)
        ]
        await store.apply(worker, Batch(0, 1.0 + i, events))
    return store


def reads(store: IndexStore) -> list[Coroutine[Any, Any, object]]:
    """One session lookup and one prefix match per session, interleaved."""
    out: list[Coroutine[Any, Any, object]] = []
    for s in range(SESSIONS):
        out.append(store.get_session(f"s{s}"))
        out.append(store.match_prefix([*chain(s), 1], None))
    return out


async def test_reads_at_once_answer_as_reads_one_by_one(store: IndexStore) -> None:
    await filled(store)
    one_by_one = [await read for read in reads(store)]
    assert all(one_by_one[0::2])  # every session found, so the comparison means something

    assert await asyncio.gather(*reads(store)) == one_by_one


async def test_a_read_cancelled_halfway_leaves_later_reads_right(store: IndexStore) -> None:
    await filled(store)
    expected = [await read for read in reads(store)]
    for turns in range(30):  # cancelled at different points of its way, reply awaited included
        for read in reads(store):
            task = asyncio.ensure_future(read)
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert await asyncio.gather(*reads(store)) == expected
