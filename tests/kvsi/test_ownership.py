"""Which central replica follows which pod: rendezvous hashing, by tables."""

from __future__ import annotations

import pytest

from kvsi.ownership import owned, owner, weight

PODS = [f"vllm-{i:03d}" for i in range(300)]
THREE = ("kvsi-central-0", "kvsi-central-1", "kvsi-central-2")


def assignment(replicas: tuple[str, ...]) -> dict[str, set[str]]:
    return {r: owned(PODS, replicas, r) for r in replicas}


@pytest.mark.parametrize("replicas", [("a",), ("a", "b"), THREE, tuple(f"r{i}" for i in range(7))])
def test_identical_views_give_disjoint_assignments_that_cover_every_pod(
    replicas: tuple[str, ...],
) -> None:
    shares = assignment(replicas)
    assert sum(len(s) for s in shares.values()) == len(PODS)
    assert set().union(*shares.values()) == set(PODS)
    # every replica gets a share near 1/N (binomial spread: 300 pods, at most 7 replicas)
    assert all(len(s) >= len(PODS) / len(replicas) / 2 for s in shares.values())


def test_the_view_order_does_not_change_the_owner() -> None:
    for pod in PODS[:50]:
        assert owner(pod, THREE) == owner(pod, tuple(reversed(THREE))) == owner(pod, set(THREE))


@pytest.mark.parametrize("lost", THREE)
def test_a_lost_replica_s_pods_move_each_to_exactly_one_survivor_and_nothing_else_moves(
    lost: str,
) -> None:
    before = assignment(THREE)
    survivors = tuple(r for r in THREE if r != lost)
    after = assignment(survivors)
    for r in survivors:
        assert before[r] <= after[r], "a survivor keeps what it had"
    gained = [after[r] - before[r] for r in survivors]
    assert set().union(*gained) == before[lost]
    assert sum(len(g) for g in gained) == len(before[lost]), "each to exactly one"


def test_a_joining_replica_takes_about_one_share_and_only_from_the_others() -> None:
    before = assignment(THREE)
    joined = (*THREE, "kvsi-central-3")
    after = assignment(joined)
    moved = {pod for r in THREE for pod in before[r] - after[r]}
    assert moved == after["kvsi-central-3"]
    assert all(after[r] <= before[r] for r in THREE), "nobody else gains"
    assert len(PODS) / 4 / 2 < len(moved) < len(PODS) / 4 * 2


def test_a_replica_not_in_its_own_view_claims_nothing() -> None:
    assert owned(PODS, ("a", "b"), "c") == set()
    assert owned(PODS, (), "a") == set()
    assert owner("vllm-000", ()) is None


def test_a_weight_tie_goes_to_the_greater_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvsi.ownership.weight", lambda replica, pod: 7)
    assert owner("p", ["b", "c", "a"]) == "c"
    assert owned(["p", "q"], ("a", "c"), "c") == {"p", "q"}


def test_weights_are_the_same_in_every_process() -> None:
    """Fixed values: a salted hash (Python's own) would split the pods differently in each
    replica."""
    assert weight("kvsi-central-0", "vllm-000") == weight("kvsi-central-0", "vllm-000")
    assert weight("a", "bc") != weight("ab", "c"), "names are separated"
    assert weight("kvsi-central-0", "vllm-000") == 0xAAA568DEA2428DB6
