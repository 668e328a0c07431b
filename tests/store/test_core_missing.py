"""`WorkerIndex.missing`: the entries no part of a worker holds, what the directory upkeep
forgets (store/redis/directories.py), checked against `holds` one entry at a time."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvsi.store.core import WorkerIndex, stored_fields
from kvsi.store.model import EntriesStored
from kvsi.store.records import Part, Residency

HASHES = st.integers(min_value=0, max_value=40)


@given(
    gpu=st.lists(HASHES, max_size=20),
    cpu=st.lists(HASHES, max_size=20),
    asked=st.lists(HASHES, max_size=30),
)
def test_missing_is_what_no_part_holds(gpu: list[int], cpu: list[int], asked: list[int]) -> None:
    index: WorkerIndex[Part, Residency] = WorkerIndex(Part, Residency)
    for medium, hashes in (("GPU", gpu), ("CPU", cpu)):
        index.begin()
        index.store(stored_fields(EntriesStored(hashes, medium, 0, "sess-1", 16)), 1.0)
    assert index.missing(asked) == {h for h in asked if not index.holds(h)}
    assert index.missing(asked) == set(asked) - set(gpu) - set(cpu)
