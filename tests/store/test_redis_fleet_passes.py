"""The passes over every worker a serving process runs besides its requests (the index
gauges' `list_workers` and `worker_losses`, the janitor's `list_workers`, a read of every
worker's state or model) go a chunk of workers a round trip and work on each round's
replies as it comes: at fleet size, parsing every reply after the last round held the event
loop, and every request with it (bench/README.md, api_background.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kvsi import metrics
from kvsi.serve import refresh_index_metrics
from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, EntriesStored, WorkerKey, WorkerState, WorkerStatus
from kvsi.store.redis import RedisStore
from kvsi.store.redis import reads as reads_module
from kvsi.store.redis.node_reads import Command
from kvsi.store.redis.reads import FIELD_CHUNK, LIST_CHUNK
from tests.store.conftest import MakeStore

ROUNDS = 3
WORKERS = [WorkerKey(f"pod-{i:03}", 0) for i in range(ROUNDS * LIST_CHUNK + 5)]


def _count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Calls of `reads.<name>` from now on: one item each."""
    done: list[int] = []
    wrapped: Callable[..., Any] = getattr(reads_module, name)

    def counted(*args: Any) -> Any:
        done.append(1)
        return wrapped(*args)

    monkeypatch.setattr(reads_module, name, counted)
    return done


def _rounds(
    reader: RedisStore, monkeypatch: pytest.MonkeyPatch, done: list[int]
) -> list[tuple[int, int]]:
    """Per round trip from now on: its commands, and how many of the earlier rounds' replies
    had been worked on (`done`) when it was sent."""
    seen: list[tuple[int, int]] = []
    batch = reader._batch

    async def recorded(commands: list[Command], raise_on_error: bool = True) -> list[Any]:
        seen.append((len(commands), len(done)))
        return await batch(commands, raise_on_error)

    monkeypatch.setattr(reader, "_batch", recorded)
    return seen


@pytest.fixture
async def fleet(make_store: MakeStore) -> RedisStore:
    """A writer of `WORKERS`, each live with one session of one block."""
    writer = await make_store()
    for i, w in enumerate(WORKERS):
        await writer.set_status(w, WorkerStatus(WorkerState.LIVE, 1.0, model="m"))
        await writer.apply(w, Batch(0, 2.0, [EntriesStored([i + 1], "GPU", 0, f"s{i}")]))
    return writer


@pytest.mark.parametrize(
    ("read", "parse"), [("list_workers", "_view"), ("worker_losses", "decode_losses")]
)
async def test_a_fleet_pass_works_on_each_round_as_it_comes(
    fleet: RedisStore,
    make_store: MakeStore,
    monkeypatch: pytest.MonkeyPatch,
    read: str,
    parse: str,
) -> None:
    reader = await make_store()
    await reader.worker_states()  # the registry and the states read before
    done = _count_calls(monkeypatch, parse)
    seen = _rounds(reader, monkeypatch, done)

    found = await getattr(reader, read)()

    assert len(found) == len(WORKERS)
    assert seen == [(LIST_CHUNK, n * LIST_CHUNK) for n in range(ROUNDS)] + [(5, 3 * LIST_CHUNK)]


async def test_every_workers_state_is_read_in_rounds(
    fleet: RedisStore, make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = await make_store()
    await reader.worker_models()  # the registry read before
    monkeypatch.setattr(reads_module, "FIELD_CHUNK", LIST_CHUNK)
    seen = _rounds(reader, monkeypatch, [])

    states = await reader.worker_states()

    assert states == dict.fromkeys(WORKERS, WorkerState.LIVE)
    assert [n for n, _ in seen] == [1] + [2 * LIST_CHUNK] * ROUNDS + [2 * 5]  # states_since
    assert FIELD_CHUNK >= LIST_CHUNK, "a field's reply is smaller than a whole meta"


async def test_the_index_gauges_are_built_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore()
    for i, w in enumerate(WORKERS[:3]):
        await store.apply(w, Batch(0, 2.0, [EntriesStored([i + 1, i + 100], "GPU", 0, "s")]))
    index = metrics.INDEX
    monkeypatch.setattr(index, "_families", index._families)  # the global, as it was after
    built_on: list[int] = []
    update = index.update

    def recording(*args: Any) -> None:
        built_on.append(threading.get_ident())
        update(*args)

    monkeypatch.setattr(index, "update", recording)

    await refresh_index_metrics(store)

    assert len(built_on) == 1 and built_on[0] != threading.get_ident()
    entries = next(f for f in index.collect() if f.name == "kvsi_index_entries")
    assert {(s.labels["worker"], s.value) for s in entries.samples} == {
        (str(w), 2.0) for w in WORKERS[:3]
    }
