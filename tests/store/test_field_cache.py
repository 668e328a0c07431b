"""The rule a reader's field cache reads the states log by (store/redis/field_cache.py), and
the cache's own bookkeeping, without Redis: states_since.lua's replies written out."""

from __future__ import annotations

from kvsi.store.model import WorkerKey, WorkerState
from kvsi.store.redis.field_cache import FieldCache, read_log
from kvsi.store.redis.known_workers import KnownWorkers

A, B, C = (WorkerKey(f"pod-{n}", 0) for n in "abc")


def entry(entry_id: str, count: int, worker: WorkerKey) -> list[object]:
    return [entry_id.encode(), [b"n", str(count).encode(), b"w", f"{worker}".encode()]]


def test_the_counts_after_the_known_one_name_their_workers() -> None:
    reply = [7, [entry("9-0", 7, A), entry("8-0", 6, B), entry("7-0", 5, A), entry("5-0", 4, C)]]

    logged = read_log(reply, 4, b"5-0")

    assert logged.workers == [A, B]
    assert (logged.counter, logged.entry) == (7, b"9-0")


def test_no_move_names_no_worker() -> None:
    assert read_log([4, [entry("5-0", 4, C)]], 4, b"5-0").workers == []


def test_a_log_that_cannot_tell_every_move_names_none() -> None:
    known = (4, b"5-0")
    gap = [7, [entry("9-0", 7, A), entry("7-0", 5, A), entry("5-0", 4, C)]]
    trimmed = [5, [entry("7-0", 5, A)]]
    went_back = [5, [entry("12-0", 5, A), entry("11-0", 4, B)]]  # count 4 is another entry now
    unlogged = [6, [entry("7-0", 5, A), entry("5-0", 4, C)]]  # an INCR without its entry
    behind = [300, []]  # states_since.lua sends none
    below = [3, []]  # the counter went back below the count: none either
    restarted = [0, []]  # a Redis back empty
    for reply in (gap, trimmed, went_back, unlogged, behind, below, restarted):
        assert read_log(reply, *known).workers is None, reply


def test_without_an_entry_to_check_the_counter_alone_is_trusted() -> None:
    assert read_log([4, []], 4, None).workers == []
    assert read_log([5, [entry("7-0", 5, A)]], 4, None).workers is None
    assert read_log([4, [entry("6-0", 4, A)]], 4, None).entry == b"6-0", "checked from now on"


def test_a_read_of_every_worker_keeps_the_newest_entry_if_it_is_the_counters() -> None:
    assert read_log([5, [entry("7-0", 5, A)]], None, None).entry == b"7-0"
    assert read_log([6, [entry("7-0", 5, A)]], None, None).entry is None, "an unlogged INCR"
    assert read_log([0, []], None, None).entry is None


def test_the_values_of_the_registered_workers_are_one_mapping_until_they_change() -> None:
    cache: FieldCache[WorkerState] = FieldCache("state", lambda raw: WorkerState(raw.decode()))
    cache.keep({A: WorkerState.LIVE, B: WorkerState.LIVE, C: WorkerState.LIVE}, 1.0)
    registry = KnownWorkers([A, B])

    first = cache.registered(registry)  # C gone since: left out, once
    again = cache.registered(registry)
    cache.keep({A: WorkerState.LIVE, B: WorkerState.LIVE}, 2.0)

    assert first == {A: WorkerState.LIVE, B: WorkerState.LIVE}
    assert again is first and cache.registered(registry) is first
    registry.add(C)
    assert cache.registered(registry) == first, "C not read yet: the others"
    assert not cache.covers(registry) and cache.missing(registry) == [C]
