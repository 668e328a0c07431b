"""The simulated engine: vLLM's hashes, prefix hits, reuse reports, LRU eviction, truth."""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsi.simulator.engine import SimulatedEngine
from kvsi.subscriber.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVEventBatch,
)
from tests.paths import WIRE

BS = 4
"""A small block size keeps token lists readable."""

PROMPT = list(range(500, 500 + 2 * BS))
"""A two-block shared system prompt."""


def tokens(seed: int, n: int) -> list[int]:
    return [seed * 1000 + i for i in range(n)]


def stored(events: list[KVCacheEvent]) -> list[BlockStored]:
    return [e for e in events if isinstance(e, BlockStored)]


def removed_hashes(events: list[KVCacheEvent]) -> list[int | bytes]:
    return [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]


def residency_by_design(events: list[KVCacheEvent]) -> tuple[set[int], dict[str, set[int]]]:
    """DESIGN.md's definitions, computed from the event list alone (no reverse map)."""
    blocks: set[int] = set()
    sessions: dict[str, set[int]] = {}
    for event in events:
        if isinstance(event, BlockStored):
            hashes = {h for h in event.block_hashes if isinstance(h, int)}
            blocks |= hashes
            if event.session_id is not None:
                sessions.setdefault(event.session_id, set()).update(hashes)
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                assert isinstance(h, int)
                blocks.discard(h)
                for owned in sessions.values():
                    owned.discard(h)
        else:
            blocks.clear()
            sessions.clear()
    return blocks, {sid: owned for sid, owned in sessions.items() if owned}


def losses_by_design(events: list[KVCacheEvent]) -> dict[str, int]:
    """Per session, blocks removed (or reset away) since its last store, from the events."""
    sessions: dict[str, set[int | bytes]] = {}
    lost: dict[str, int] = {}
    for event in events:
        if isinstance(event, BlockStored):
            if event.session_id is not None:
                lost[event.session_id] = 0
                sessions.setdefault(event.session_id, set()).update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            for sid, owned in sessions.items():
                lost[sid] += len(owned & set(event.block_hashes))
                owned.difference_update(event.block_hashes)
        else:
            for sid, owned in sessions.items():
                lost[sid] += len(owned)
                owned.clear()
    return {sid: n for sid, n in lost.items() if n}


@pytest.mark.parametrize("pythonhashseed", [None, "0"])
def test_block_hashes_equal_vllm_0_33_sha256_vectors(pythonhashseed: str | None) -> None:
    vectors = json.loads((WIRE / "hashes.json").read_text())
    vector_set = next(
        v
        for v in vectors["vector_sets"]
        if v["algo"] == "sha256" and v["PYTHONHASHSEED"] == pythonhashseed
    )
    plain = [c for c in vector_set["cases"] if c["name"].startswith(("a_", "b_", "e_"))]
    assert len(plain) == 6
    for case in plain:
        token_ids = vectors["token_sets"][case["tokens"]]
        engine = SimulatedEngine(num_blocks=64, block_size=case["block_size"], seed=pythonhashseed)
        assert engine.block_hashes(token_ids) == [int(b["event_hash_int"]) for b in case["blocks"]]


def test_event_hashes_use_the_full_u64_range_and_encode_as_uint64() -> None:
    engine = SimulatedEngine(num_blocks=256, block_size=BS)
    events = engine.run_request("s", tokens(1, 128 * BS))
    hashes = [h for e in stored(events) for h in e.block_hashes]
    assert all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes)
    assert any(isinstance(h, int) and h >= 2**63 for h in hashes)
    payload = msgspec.msgpack.encode(KVEventBatch(ts=1.0, events=events))
    decoded = msgspec.msgpack.decode(payload, type=KVEventBatch)
    assert decoded.events == events


def test_first_request_stores_its_full_blocks_with_vllm_0_33_fields() -> None:
    engine = SimulatedEngine(num_blocks=16, block_size=BS)
    request = [*PROMPT, *tokens(1, 2 * BS + 3)]  # 4 full blocks and 3 tokens more
    events = engine.run_request("sess-A", request)
    assert len(events) == 1
    event = events[0]
    assert isinstance(event, BlockStored)
    assert event.block_hashes == engine.block_hashes(request)
    assert len(event.block_hashes) == 4
    assert event.parent_block_hash is None
    assert event.token_ids == request[: 4 * BS]
    assert (event.block_size, event.medium, event.session_id) == (BS, "GPU", "sess-A")
    assert (event.lora_id, event.lora_name) == (None, None)
    assert engine.resident() == set(event.block_hashes)
    assert engine.session_residency() == {"sess-A": set(event.block_hashes)}


def test_next_turn_reports_the_reused_prefix_then_stores_the_rest() -> None:
    engine = SimulatedEngine(num_blocks=16, block_size=BS)
    turn1 = [*PROMPT, *tokens(1, 2 * BS)]
    turn2 = [*turn1, *tokens(2, BS)]
    engine.run_request("sess-A", turn1)
    events = engine.run_request("sess-A", turn2)
    hashes = engine.block_hashes(turn2)
    reuse, new = stored(events)
    assert len(events) == 2
    assert reuse.block_hashes == hashes[:4]
    assert reuse.parent_block_hash is None
    assert reuse.token_ids == turn2[: 4 * BS]
    assert reuse.session_id == "sess-A"
    assert new.block_hashes == hashes[4:]
    assert new.parent_block_hash == hashes[3]
    assert new.token_ids == turn2[4 * BS : 5 * BS]
    assert engine.session_residency() == {"sess-A": set(hashes)}


def test_reuse_report_gives_a_shared_system_prompt_to_every_session() -> None:
    engine = SimulatedEngine(num_blocks=16, block_size=BS)
    a = [*PROMPT, *tokens(1, BS)]
    b = [*PROMPT, *tokens(2, BS)]
    engine.run_request("sess-A", a)
    events = engine.run_request("sess-B", b)
    prompt = engine.block_hashes(PROMPT)
    assert stored(events)[0].block_hashes == prompt
    assert stored(events)[0].session_id == "sess-B"
    residency = engine.session_residency()
    assert residency["sess-A"] == set(engine.block_hashes(a))
    assert residency["sess-B"] == set(engine.block_hashes(b))
    assert residency["sess-A"] & residency["sess-B"] == set(prompt)


def test_without_full_report_mode_a_prefix_hit_is_silent() -> None:
    engine = SimulatedEngine(num_blocks=16, block_size=BS, report_mode_full=False)
    engine.run_request("sess-A", [*PROMPT, *tokens(1, BS)])
    events = engine.run_request("sess-B", [*PROMPT, *tokens(2, BS)])
    (only,) = events
    assert isinstance(only, BlockStored)
    assert only.block_hashes == engine.block_hashes([*PROMPT, *tokens(2, BS)])[2:]
    assert not set(engine.block_hashes(PROMPT)) & engine.session_residency()["sess-B"]


def test_a_full_pool_evicts_the_least_recent_request_tail_first() -> None:
    engine = SimulatedEngine(num_blocks=6, block_size=BS)
    old = tokens(1, 3 * BS)
    recent = tokens(2, 3 * BS)
    engine.run_request("old", old)
    engine.run_request("recent", recent)
    events = engine.run_request("new", tokens(3, 2 * BS))
    old_hashes = engine.block_hashes(old)
    assert [type(e) for e in events] == [BlockRemoved, BlockRemoved, BlockStored]
    assert removed_hashes(events) == [old_hashes[2], old_hashes[1]]
    assert all(isinstance(e, BlockRemoved) and e.medium == "GPU" for e in events[:2])
    assert len(engine.resident()) == 6
    assert engine.session_residency()["old"] == {old_hashes[0]}
    assert old_hashes[1] not in engine.resident()


def test_eviction_never_takes_the_running_request_prefix() -> None:
    engine = SimulatedEngine(num_blocks=4, block_size=BS)
    engine.run_request("sess-A", PROMPT)
    other = tokens(1, 2 * BS)
    engine.run_request("other", other)  # now the prompt is the least recently used
    second = [*PROMPT, *tokens(2, 2 * BS)]
    events = engine.run_request("sess-B", second)
    assert removed_hashes(events) == list(reversed(engine.block_hashes(other)))
    assert engine.resident() == set(engine.block_hashes(second))
    assert engine.session_residency()["sess-A"] == set(engine.block_hashes(PROMPT))
    assert "other" not in engine.session_residency()


def test_a_request_larger_than_the_pool_is_refused() -> None:
    engine = SimulatedEngine(num_blocks=2, block_size=BS)
    with pytest.raises(ValueError, match="needs 3 blocks"):
        engine.run_request("s", tokens(1, 3 * BS))
    assert engine.resident() == set()


def test_reset_clears_the_pool_and_every_session() -> None:
    engine = SimulatedEngine(num_blocks=16, block_size=BS)
    engine.run_request("sess-A", [*PROMPT, *tokens(1, BS)])
    engine.run_request("sess-B", [*PROMPT, *tokens(2, BS)])
    assert engine.reset() == [AllBlocksCleared()]
    assert engine.resident() == set()
    assert engine.session_residency() == {}
    events = engine.run_request("sess-A", [*PROMPT, *tokens(1, BS)])
    assert len(events) == 1  # a miss: no reuse report
    assert stored(events)[0].parent_block_hash is None


def test_events_without_session_change_blocks_only() -> None:
    engine = SimulatedEngine(num_blocks=16, block_size=BS)
    events = engine.run_request(None, PROMPT)
    assert stored(events)[0].session_id is None
    assert engine.resident() == set(engine.block_hashes(PROMPT))
    assert engine.session_residency() == {}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c", None]),
            st.integers(min_value=0, max_value=3),
            st.integers(min_value=0, max_value=5 * BS),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(min_value=5, max_value=12),
    st.booleans(),
    st.booleans(),
)
def test_truth_equals_design_definition_over_any_request_sequence(
    steps: list[tuple[str | None, int, int]], capacity: int, full: bool, with_reset: bool
) -> None:
    engine = SimulatedEngine(num_blocks=capacity, block_size=BS, report_mode_full=full)
    contexts: dict[str | None, list[int]] = {}
    log: list[KVCacheEvent] = []
    for i, (session, variant, extra) in enumerate(steps):
        context = contexts.setdefault(session, [*PROMPT, *tokens(variant + 1, BS)])
        context.extend(tokens(10 + i, extra))
        if len(context) // BS > capacity:
            context[:] = [*PROMPT, *tokens(variant + 1, BS)]
        log.extend(engine.run_request(session, context))
        if with_reset and i == len(steps) // 2:
            log.extend(engine.reset())
        blocks, sessions = residency_by_design(log)
        assert engine.resident() == blocks
        assert engine.session_residency() == sessions
        assert engine.session_losses() == losses_by_design(log)
        assert len(blocks) <= capacity
        assert all(owned <= blocks for owned in sessions.values())


def test_losses_count_since_the_last_store_and_frontiers_place_the_last_block() -> None:
    engine = SimulatedEngine(num_blocks=6, block_size=BS)
    old = tokens(1, 3 * BS)
    engine.run_request("old", old)
    engine.run_request("recent", tokens(2, 3 * BS))
    engine.run_request("new", tokens(3, 2 * BS))  # evicts old's blocks 2 and 1
    assert engine.session_losses() == {"old": 2}
    assert engine.session_frontiers()["old"] == (engine.block_hashes(old)[2], 2)
    engine.run_request("old", [*old, *tokens(4, BS)])  # its own store: nothing lost since
    assert "old" not in engine.session_losses()
    assert engine.session_frontiers()["old"] == (engine.block_hashes([*old, *tokens(4, BS)])[3], 3)
    held = {sid: len(owned) for sid, owned in engine.session_residency().items()}
    before = engine.session_losses()
    engine.reset()  # takes everything each session held
    assert engine.session_losses() == {
        sid: before.get(sid, 0) + held.get(sid, 0) for sid in held.keys() | before.keys()
    }


def test_forget_idle_drops_a_session_holding_only_the_shared_prompt_not_its_blocks() -> None:
    now = [0.0]
    engine = SimulatedEngine(num_blocks=64, clock=lambda: now[0])
    prompt = list(range(32))
    engine.run_request("old", prompt)
    now[0] = 100.0
    engine.run_request("new", [*prompt, *range(100, 116)])
    resident = engine.resident()

    assert engine.forget_idle(before=50.0) == 1
    assert set(engine.session_residency()) == {"new"}
    assert engine.resident() == resident, "the pool keeps every block"
    assert set(engine.session_frontiers()) == {"new"}
    assert engine.forget_idle(before=50.0) == 0
    engine.run_request("old", prompt)
    assert engine.session_residency()["old"] == set(engine.block_hashes(prompt))


def test_forget_idle_leaves_no_trace_of_forgotten_sessions() -> None:
    now = [0.0]
    engine = SimulatedEngine(num_blocks=8, block_size=BS, clock=lambda: now[0])
    for turn in range(50):
        now[0] = float(turn)
        engine.run_request(f"s{turn}", PROMPT)
    assert engine.forget_idle(before=49.0) == 49
    assert set(engine.session_residency()) == {"s49"}
    for other in range(4):
        engine.run_request(None, tokens(10 + other, 2 * BS))
    assert set(engine.resident()).isdisjoint(engine.block_hashes(PROMPT)), "prompt evicted"
    assert set(engine.session_losses()) == {"s49"}
    assert engine.session_residency() == {}
