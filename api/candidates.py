"""Which workers a request may be sent to, from the store's worker states.

Imports only the store model and api.ranking. Every connected worker is what a route or a
hint ranks by default; deriving it (a set, the rank order, the workers by pod) is O(fleet),
so it is derived once per states mapping: the store answers the same mapping while no
worker's state changed and none came or went (`IndexReader.worker_states`). A request then
costs O(the workers it names or that hold something), whatever the fleet's size.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvsi.api.ranking import Candidates
from kvsi.store.model import WorkerKey, WorkerState


class _Fleet:
    """What is derived from one states mapping (kept alive here, so its identity holds)."""

    __slots__ = ("by_pod", "connected", "states")

    def __init__(self, states: Mapping[WorkerKey, WorkerState]) -> None:
        self.states = states
        self.connected = Candidates(
            k for k, state in states.items() if state != WorkerState.DISCONNECTED
        )
        by_pod: dict[str, list[WorkerKey]] = {}
        for key in states:
            by_pod.setdefault(key.pod, []).append(key)
        self.by_pod = by_pod


_last: _Fleet | None = None


def _fleet(states: Mapping[WorkerKey, WorkerState]) -> _Fleet:
    global _last
    if _last is None or _last.states is not states:
        _last = _Fleet(states)
    return _last


def connected(states: Mapping[WorkerKey, WorkerState]) -> Candidates:
    """Every worker that is not disconnected."""
    return _fleet(states).connected


def named(wanted: list[str], states: Mapping[WorkerKey, WorkerState]) -> Candidates:
    """The known workers `wanted` names: "POD" (every rank of the pod) or "POD/RANK", in any
    state; names of no known worker are left out."""
    by_pod = _fleet(states).by_pod
    chosen: list[WorkerKey] = []
    for item in wanted:
        pod, _, rank_text = item.partition("/")
        ranks = by_pod.get(pod, [])
        chosen += ranks if not rank_text else [k for k in ranks if k.dp_rank == int(rank_text)]
    return Candidates(chosen)


def serving(
    candidates: Candidates, models: Mapping[WorkerKey, str | None], model: str
) -> Candidates:
    """Those of `candidates` serving `model` (workers whose model is unknown are left out)."""
    return Candidates(k for k in candidates.ordered if models.get(k) == model)
