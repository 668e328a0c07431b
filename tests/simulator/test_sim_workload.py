"""The agentic workload: shared system prompt, growing contexts, sessions coming and going."""

from __future__ import annotations

import pytest

from kvsi.simulator.engine import SimulatedEngine
from kvsi.simulator.workload import AgenticWorkload, Request


def run(workload: AgenticWorkload) -> list[Request]:
    return list(workload)


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    a = run(AgenticWorkload(sessions=3, seed=7, total_sessions=6))
    b = run(AgenticWorkload(sessions=3, seed=7, total_sessions=6))
    c = run(AgenticWorkload(sessions=3, seed=8, total_sessions=6))
    assert a == b
    assert a != c


def test_every_turn_extends_the_previous_context_of_its_session() -> None:
    last: dict[str, Request] = {}
    for request in AgenticWorkload(sessions=4, seed=1, total_sessions=12):
        before = last.get(request.session_id)
        if before is None:
            assert request.turn == 1
        else:
            assert request.turn == before.turn + 1
            assert len(request.token_ids) > len(before.token_ids)
            assert request.token_ids[: len(before.token_ids)] == before.token_ids
        last[request.session_id] = request
    assert len(last) == 12


def test_sessions_share_the_system_prompt_blocks() -> None:
    workload = AgenticWorkload(sessions=5, seed=2, system_prompt_blocks=3, total_sessions=5)
    firsts = {r.session_id: r.token_ids[: 3 * 16] for r in workload if r.turn == 1}
    assert len(firsts) == 5
    assert len({tuple(t) for t in firsts.values()}) == 1


def test_sessions_start_and_finish_over_time_within_bounds() -> None:
    workload = AgenticWorkload(
        sessions=4, seed=3, turns=(2, 5), max_context_tokens=600, total_sessions=20
    )
    active_seen = set()
    finished = []
    for request in workload:
        assert len(request.token_ids) <= 600
        assert len(workload.active_sessions) <= 4
        active_seen.add(request.session_id)
        if request.last:
            finished.append(request.session_id)
            assert request.session_id not in workload.active_sessions
    assert len(finished) == len(set(finished)) == 20
    assert workload.started_sessions == workload.finished_sessions == 20
    assert workload.next_request() is None


def test_the_workload_produces_prefix_hits_on_an_engine() -> None:
    workload = AgenticWorkload(sessions=4, seed=4, total_sessions=8)
    engine = SimulatedEngine(num_blocks=workload.max_context_blocks * 8)
    reuse_reports = 0
    for request in workload:
        events = engine.run_request(request.session_id, request.token_ids)
        first = events[0] if events else None
        if first is not None and getattr(first, "parent_block_hash", 0) is None and len(events) > 1:
            reuse_reports += 1
    assert reuse_reports > 8


def test_a_context_too_small_for_one_turn_is_refused() -> None:
    with pytest.raises(ValueError, match="max_context_tokens"):
        AgenticWorkload(max_context_tokens=64)
