"""The session list's orders and id prefix, the same on every backend (run once per backend)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsi.store.base import IndexStore
from kvsi.store.model import (
    Batch,
    EntriesRemoved,
    EntriesStored,
    InvalidCursorError,
    SessionSummary,
    StoreEvent,
    WorkerCleared,
    WorkerKey,
)
from kvsi.store.paging import SessionOrder
from tests.conformance.conftest import StoreFactory
from tests.conformance.reference import Reference

A = WorkerKey("pod-a", 0)
A1 = WorkerKey("pod-a", 1)
B = WorkerKey("pod-b", 0)


async def walk(
    store: IndexStore,
    *,
    order: SessionOrder,
    limit: int,
    pod: str | None = None,
    prefix: str | None = None,
) -> list[SessionSummary]:
    """Every page from the first; full pages before the last, each session once."""
    out: list[SessionSummary] = []
    cursor = None
    while True:
        page = await store.list_sessions(
            pod=pod, limit=limit, cursor=cursor, order=order, prefix=prefix
        )
        out.extend(page.items)
        if page.next_cursor is None:
            break
        assert len(page.items) == limit, "a page before the last must be full"
        cursor = page.next_cursor
    ids = [s.session_id for s in out]
    assert len(ids) == len(set(ids))
    return out


def rows(sessions: list[SessionSummary]) -> list[tuple[str, int, int, float]]:
    return [(s.session_id, s.blocks, s.workers, s.last_seen) for s in sessions]


async def fill(store: IndexStore) -> None:
    """s3 holds 5 (3 on A, 2 on B), t1 and t2 hold 2 each (a tie), s1 1, s2 none any more;
    s1 was last seen on B, where it holds nothing."""
    await store.apply(A, Batch(0, 10.0, [EntriesStored([1, 2, 3], "GPU", 0, "s3")]))
    await store.apply(A, Batch(1, 11.0, [EntriesStored([4, 5], "CPU", 0, "t2")]))
    await store.apply(A, Batch(2, 12.0, [EntriesStored([6], "GPU", 0, "s1")]))
    await store.apply(A1, Batch(0, 13.0, [EntriesStored([7, 8], "GPU", 0, "t1")]))
    await store.apply(A1, Batch(1, 14.0, [EntriesStored([9], "GPU", 0, "s2")]))
    await store.apply(A1, Batch(2, 15.0, [EntriesRemoved([9])]))
    await store.apply(B, Batch(0, 16.0, [EntriesStored([1, 2], "GPU", 0, "s3")]))
    await store.apply(B, Batch(1, 17.0, [EntriesStored([10], "GPU", 0, "s1")]))
    await store.apply(B, Batch(2, 18.0, [EntriesRemoved([10])]))


async def test_by_blocks_most_first_ties_by_id_only_sessions_holding_blocks(
    store: IndexStore,
) -> None:
    await fill(store)
    got = await walk(store, order="blocks", limit=2)
    assert rows(got) == [
        ("s3", 5, 2, 16.0),
        ("t1", 2, 1, 13.0),
        ("t2", 2, 1, 11.0),
        ("s1", 1, 1, 17.0),  # last seen on B, where it holds nothing: the global time
    ]
    # The default order still lists s2, which holds nothing.
    assert [s.session_id for s in await walk(store, order="last_seen", limit=2)] == [
        "s1",
        "s3",
        "s2",
        "t1",
        "t2",
    ]


async def test_by_blocks_with_a_pod_counts_only_that_pod(store: IndexStore) -> None:
    await fill(store)
    on_a = await walk(store, order="blocks", limit=10, pod="pod-a")
    assert rows(on_a) == [
        ("s3", 3, 1, 16.0),
        ("t1", 2, 1, 13.0),
        ("t2", 2, 1, 11.0),
        ("s1", 1, 1, 17.0),
    ]
    on_b = await walk(store, order="blocks", limit=1, pod="pod-b")
    assert rows(on_b) == [("s3", 2, 1, 16.0)]
    assert await walk(store, order="blocks", limit=5, pod="pod-z") == []


@pytest.mark.parametrize("order", ["last_seen", "blocks"])
async def test_prefix_keeps_ids_starting_with_it(store: IndexStore, order: SessionOrder) -> None:
    await fill(store)
    assert {s.session_id for s in await walk(store, order=order, limit=1, prefix="t")} == {
        "t1",
        "t2",
    }
    assert [s.session_id for s in await walk(store, order=order, limit=5, prefix="s3")] == ["s3"]
    assert await walk(store, order=order, limit=5, prefix="s3x") == []
    assert await walk(store, order=order, limit=5, prefix="S") == []  # case matters
    on_b = await walk(store, order=order, limit=5, prefix="s", pod="pod-b")
    assert [s.session_id for s in on_b] == ["s3"]


async def test_prefix_is_a_plain_string_never_a_pattern(store: IndexStore) -> None:
    """Glob and regex characters in ids are themselves (a backend must not match with them)."""
    for seq, sid in enumerate(["a*", "a*b", "ab", "a?c", "a[b]", "a\\b", "x"]):
        await store.apply(A, Batch(seq, float(seq), [EntriesStored([seq], "GPU", 0, sid)]))
    for order in ("last_seen", "blocks"):
        found = {s.session_id for s in await walk(store, order=order, limit=2, prefix="a*")}
        assert found == {"a*", "a*b"}
        assert [s.session_id for s in await walk(store, order=order, limit=2, prefix="a[")] == [
            "a[b]"
        ]
        assert [s.session_id for s in await walk(store, order=order, limit=2, prefix="a\\")] == [
            "a\\b"
        ]
        assert [s.session_id for s in await walk(store, order=order, limit=2, prefix="a?")] == [
            "a?c"
        ]


async def test_a_selective_prefix_over_many_sessions_pages_in_order(store: IndexStore) -> None:
    """Few matches spread over many sessions on several workers (more fetch rounds)."""
    for w, worker in enumerate((A, A1, B)):
        events: list[StoreEvent] = [
            EntriesStored(list(range(1000 * w + i, 1000 * w + i + 1 + i % 3)), "GPU", 0, f"s{i}")
            for i in range(w, 240, 3)
        ]
        await store.apply(worker, Batch(0, 100.0 + w, events))
    by_time = await walk(store, order="last_seen", limit=3, prefix="s1")
    everything = await walk(store, order="last_seen", limit=1000)
    assert rows(by_time) == rows([s for s in everything if s.session_id.startswith("s1")])
    assert len(by_time) == 1 + 10 + 100
    by_blocks = await walk(store, order="blocks", limit=7, prefix="s1")
    assert sorted(rows(by_blocks)) == sorted(rows(by_time))
    assert [(-s.blocks, s.session_id) for s in by_blocks] == sorted(
        (-s.blocks, s.session_id) for s in by_blocks
    )


@pytest.mark.parametrize(("order", "other"), [("last_seen", "blocks"), ("blocks", "last_seen")])
async def test_a_cursor_continues_only_its_own_order(
    store: IndexStore, order: SessionOrder, other: SessionOrder
) -> None:
    await fill(store)
    page = await store.list_sessions(pod=None, limit=1, cursor=None, order=order)
    assert page.next_cursor is not None
    with pytest.raises(InvalidCursorError, match=f"from order={order}, not order={other}"):
        await store.list_sessions(pod=None, limit=1, cursor=page.next_cursor, order=other)


@pytest.mark.parametrize("cursor", ["blocks:", "blocks:x|s", "blocks:-1|s", "blocks:2"])
async def test_a_malformed_blocks_cursor_is_refused(store: IndexStore, cursor: str) -> None:
    await fill(store)
    with pytest.raises(InvalidCursorError, match="not a session cursor"):
        await store.list_sessions(pod=None, limit=1, cursor=cursor, order="blocks")


# -- property: the blocks order against the reference model ---------------------------------

events = st.one_of(
    st.builds(
        EntriesStored,
        st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=4),
        st.sampled_from(["GPU", "CPU"]),
        st.just(0),
        st.sampled_from(["s1", "s2", "t1", "t2", "u"]),
    ),
    st.builds(
        EntriesRemoved,
        st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=4),
        st.sampled_from(["GPU", "CPU"]),
        st.just(0),
    ),
    st.just(WorkerCleared()),
)
plans = st.lists(
    st.tuples(st.sampled_from([A, A1, B]), st.lists(events, min_size=1, max_size=4)),
    max_size=15,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    plan=plans,
    pod=st.sampled_from([None, "pod-a", "pod-b"]),
    prefix=st.sampled_from([None, "s", "t1", "v"]),
    limit=st.integers(min_value=1, max_value=3),
)
async def test_blocks_order_matches_the_reference_model(
    make_store: StoreFactory,
    plan: list[tuple[WorkerKey, list[StoreEvent]]],
    pod: str | None,
    prefix: str | None,
    limit: int,
) -> None:
    store = await make_store()
    ref = Reference()
    seqs: dict[WorkerKey, int] = {}
    for n, (worker, evs) in enumerate(plan):
        seqs[worker] = seqs.get(worker, -1) + 1
        batch = Batch(seqs[worker], float(n), evs)
        ref.apply(worker, batch)
        await store.apply(worker, batch)
    held: dict[str, list[int]] = {}
    for (sid, worker), entries in ref.residency.items():
        on_pod = pod is None or worker.pod == pod
        if entries and on_pod and (prefix is None or sid.startswith(prefix)):
            held.setdefault(sid, []).append(len(entries))
    want = sorted((-sum(c), sid, len(c)) for sid, c in held.items())
    got = await walk(store, order="blocks", limit=limit, pod=pod, prefix=prefix)
    assert [(-s.blocks, s.session_id, s.workers) for s in got] == want
