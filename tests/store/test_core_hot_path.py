"""The index core's hot-path forms, checked against plain models: a store's fields read in
one call (`stored_fields`), the part of the last (medium, group) remembered, the new entries
held in one `setdefault` each, and a removal's losses counted on the residencies
(`Residency.dropping`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvsi.store.core import WorkerIndex, stored_fields
from kvsi.store.model import EntriesStored
from kvsi.store.records import Part, Residency

MEDIA = st.sampled_from([None, "", "GPU", "CPU"])
GROUPS = st.sampled_from([None, 0, 1])
HASHES = st.lists(st.integers(min_value=0, max_value=30), max_size=6)
SESSIONS = st.sampled_from(["sess-a", "sess-b", "sess-c", None])


def _part_name(medium: str | None, group: int | None) -> tuple[str, int]:
    """vLLM's unset values: medium None (or empty) is GPU, group None is 0."""
    return (medium or "GPU", group or 0)


def test_stored_fields_are_the_event_fields_in_their_order() -> None:
    event = EntriesStored([1, 2], "CPU", 3, "sess-1", 9, 16, [5, 6])
    assert stored_fields(event) == tuple(getattr(event, f) for f in event.__struct_fields__)
    assert stored_fields(event) == ([1, 2], "CPU", 3, "sess-1", 9, 16, [5, 6])


Step = tuple[bool, str | None, int | None, list[int], str | None]

STEPS = st.lists(st.tuples(st.booleans(), MEDIA, GROUPS, HASHES, SESSIONS), max_size=40)


@given(steps=STEPS)
def test_stores_and_removals_across_parts_match_a_plain_model(steps: list[Step]) -> None:
    """Each part holds what its stores named minus what its removals took, whatever the
    order the parts are named in; each residency counts exactly the entries it holds."""
    index: WorkerIndex[Part, Residency] = WorkerIndex(Part, Residency)
    held: dict[tuple[str, int], dict[int, set[str | None]]] = {}
    for ts, (is_store, medium, group, hashes, sid) in enumerate(steps):
        index.begin()
        model = held.setdefault(_part_name(medium, group), {})
        if is_store:
            event = EntriesStored(list(hashes), medium, group, sid, None, 16)
            index.store(stored_fields(event), float(ts))
            for h in hashes:
                model.setdefault(h, set()).add(sid)
        else:
            part = index.part(medium, group)
            if part is not None:
                index.remove(part, hashes, lost=True)
            for h in hashes:
                model.pop(h, None)
        index.rows()
    for (medium, group), model in held.items():
        part = index.part(medium, group)
        if part is None:
            assert not model
        else:
            assert (part.medium, part.group) == (medium, group)
            assert set(part.holders) == set(model)
    for sid, res in index.residencies.items():
        entries = sum(1 for model in held.values() for sids in model.values() if sid in sids)
        assert res.total == entries, sid
        assert res.dropping == 0


def test_a_removal_that_fails_part_way_leaves_no_count_behind() -> None:
    """`dropping` is back to 0 on every residency even when applying the losses raises
    (here: a residency whose count of the part is missing), or the next removal would
    take the leftover too."""
    index: WorkerIndex[Part, Residency] = WorkerIndex(Part, Residency)
    index.begin()
    index.store(stored_fields(EntriesStored([9], "GPU", 0, "sess-a", None, 16)), 1.0)
    index.store(stored_fields(EntriesStored([1, 2], "CPU", 0, "sess-a", None, 16)), 1.0)
    index.store(stored_fields(EntriesStored([3], "CPU", 0, "sess-b", None, 16)), 1.0)
    part = index.part("CPU", 0)
    assert part is not None and part.pid  # not part 0: counted in `in_others`
    index.residencies["sess-b"].in_others.clear()
    with pytest.raises(KeyError):
        index.remove(part, [1, 3], lost=True)
    assert [res.dropping for res in index.residencies.values()] == [0, 0]


def test_a_removal_that_fails_while_it_counts_leaves_no_count_behind() -> None:
    """The same when a hash itself fails (not an int or bytes: compiled, a TypeError) after
    some entries were counted: a later removal still takes its entries from the session."""
    index: WorkerIndex[Part, Residency] = WorkerIndex(Part, Residency)
    index.begin()
    index.store(stored_fields(EntriesStored([1, 2, 3], "GPU", 0, "sess-a", None, 16)), 1.0)
    part = index.part("GPU", 0)
    assert part is not None
    bad: list[object] = [1, ["not", "a", "hash"]]
    with pytest.raises(TypeError):
        index.remove(part, bad, lost=True)  # type: ignore[arg-type]
    res = index.residencies["sess-a"]
    assert res.dropping == 0
    total = res.total  # the failed removal's counts are not settled (as before `dropping`)
    index.remove(part, [2], lost=True)
    assert (total - res.total, res.lost, res.dropping) == (1, 1, 0)
