"""`merged_removals`: a batch's runs of removals from one part, applied as one removal, leave
what applying each in turn leaves (index, losses, the change feed's rows)."""

from __future__ import annotations

import asyncio

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsi.store.core import merged_removals
from kvsi.store.feed import FeedRecord
from kvsi.store.memory import MemoryStore
from kvsi.store.model import (
    CLEARED,
    REMOVED,
    STORED,
    Batch,
    EntriesRemoved,
    EntriesStored,
    StoreEvent,
    WorkerCleared,
    WorkerKey,
)
from kvsi.subscriber import wire
from kvsi.subscriber.decode import ingest_decoder
from tests.store.snapshots import snapshot

W = WorkerKey("pod-a", 0)
PARTS = [("GPU", 0), ("CPU", 0)]
HASHES = st.integers(min_value=0, max_value=30)
EVENTS = st.one_of(
    st.tuples(st.just("store"), st.sampled_from(PARTS), st.lists(HASHES, max_size=5), HASHES),
    st.tuples(st.just("remove"), st.sampled_from(PARTS), st.lists(HASHES, max_size=3), HASHES),
)


def test_runs_of_removals_from_one_part_become_one_in_order() -> None:
    stored = EntriesStored([1], "GPU", 0, "s")
    events: list[StoreEvent] = [
        EntriesRemoved([1], "GPU", 0),
        EntriesRemoved([2, 3], "GPU", 0),
        EntriesRemoved([4], "CPU", 0),
        EntriesRemoved([5], "CPU", 0),
        stored,
        EntriesRemoved([6], "GPU", 0),
        EntriesRemoved([6], "GPU", 1),
    ]
    assert merged_removals(events) == [
        EntriesRemoved([1, 2, 3], "GPU", 0),
        EntriesRemoved([4, 5], "CPU", 0),
        stored,
        EntriesRemoved([6], "GPU", 0),
        EntriesRemoved([6], "GPU", 1),
    ]
    assert events[0] == EntriesRemoved([1], "GPU", 0)  # the batch's own events untouched
    alone = [stored, EntriesRemoved([1], "GPU", 0), stored]
    assert merged_removals(alone) is alone


def _removals_payload(*hashes: list[int]) -> bytes:
    """A vLLM batch of one BlockRemoved per list of `hashes`, all from the GPU."""
    events = [wire.BlockRemoved(block_hashes=h, medium="GPU") for h in hashes]
    return msgspec.msgpack.encode(wire.KVEventBatch(ts=1.0, events=events))


def test_the_ingest_decoders_removals_are_merged() -> None:
    """The decoders' events are subclasses of the store's: a run of vLLM's one-block
    BlockRemoved events from a stream merges as the store's own events do."""
    payload = _removals_payload([1], [2])
    for tokens in (False, True):
        events = ingest_decoder(tokens=tokens).decode(payload).events
        assert merged_removals(events) == [EntriesRemoved([1, 2], "GPU", None)]


def test_every_event_the_decoders_make_carries_its_kind() -> None:
    """The stores dispatch on `kind`, not `isinstance` (EntriesStored.kind): each class has
    its own, and the decoders' events (subclasses, or the store's own types) carry theirs."""
    kinds = {EntriesStored: STORED, EntriesRemoved: REMOVED, WorkerCleared: CLEARED}
    assert len(set(kinds.values())) == 3
    for cls, kind in kinds.items():
        assert cls.kind == kind
    payload = msgspec.msgpack.encode(
        wire.KVEventBatch(
            ts=1.0,
            events=[
                wire.BlockStored(
                    block_hashes=[1], parent_block_hash=None, token_ids=[0] * 16, block_size=16,
                    lora_id=None, medium="GPU", lora_name=None,
                ),
                wire.BlockRemoved(block_hashes=[1], medium="GPU"),
                wire.AllBlocksCleared(),
            ],
        )
    )  # fmt: skip
    for tokens in (False, True):
        events = ingest_decoder(tokens=tokens).decode(payload).events
        assert [e.kind for e in events] == [STORED, REMOVED, CLEARED]
        for event, cls in zip(events, kinds, strict=True):
            assert isinstance(event, cls), (event, cls)


def _events(drawn: list[tuple[str, tuple[str, int], list[int], int]]) -> list[StoreEvent]:
    out: list[StoreEvent] = [EntriesStored([100], m, g, "s0") for m, g in PARTS]
    for kind, (medium, group), hashes, session in drawn:
        if kind == "store":
            out.append(EntriesStored(hashes, medium, group, f"s{session % 4}"))
        else:
            out.append(EntriesRemoved(hashes, medium, group))
    return out


def _apart(events: list[StoreEvent]) -> list[StoreEvent]:
    """The same events with an empty store (a no-op: its part exists) between removals, so
    no two are adjacent and each is applied on its own."""
    out: list[StoreEvent] = []
    for event in events:
        if isinstance(event, EntriesRemoved) and isinstance(out[-1], EntriesRemoved):
            out.append(EntriesStored([], "GPU", 0))
        out.append(event)
    return out


@settings(max_examples=200, deadline=None)
@given(
    first=st.lists(EVENTS, max_size=25),
    second=st.lists(EVENTS, max_size=25),
)
def test_a_batch_with_merged_removals_leaves_what_each_removal_in_turn_leaves(
    first: list[tuple[str, tuple[str, int], list[int], int]],
    second: list[tuple[str, tuple[str, int], list[int], int]],
) -> None:
    async def run(spread: bool) -> tuple[object, list[FeedRecord]]:
        store = MemoryStore()
        sub = (await store.change_feed()).subscribe(after=None)
        for seq, drawn in enumerate((first, second)):
            events = _events(drawn)
            await store.apply(W, Batch(seq, 1.0 + seq, _apart(events) if spread else events))
        records = []
        while not sub.queue.empty():
            entry = await sub.next()
            records.append(entry.change)
        return await snapshot(store), records

    async def both() -> None:
        assert await run(spread=False) == await run(spread=True)

    asyncio.run(both())


def test_removals_of_one_part_merge_across_the_store_and_the_decoders_types() -> None:
    """A run of removals may mix the store's own type and the decoder's subclass (a batch
    read event by event, map- and array-encoded at once): one part's run still merges."""
    decoded = ingest_decoder().decode(_removals_payload([2], [3])).events
    assert all(type(e) is not EntriesRemoved for e in decoded), "the decoder's own subclass"
    events: list[StoreEvent] = [EntriesRemoved([1], "GPU", None), *decoded]
    assert merged_removals(events) == [EntriesRemoved([1, 2, 3], "GPU", None)]
