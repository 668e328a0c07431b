"""How `/v1/route` ranks workers: the score formula, in one place, free of HTTP.

Imports only the store model. The formula (also in the OpenAPI description and the README):

- weight(m): the request's per-medium weight, default GPU 1.0, CPU 0.8, any other 0.5;
- prefix score: over the blocks of the longest run of the prompt's blocks, from the first,
  that the worker holds, the sum of the best weight among the media holding each block;
- session score: the sum over media of weight(m) x the session's blocks on that medium there;
- score: the prefix score when the request gives the prompt, else the session score.
  Order: score, then the session score, then `live` before other states, then pod, dp_rank.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from kvsi.store.model import WorkerKey

LIVE = "live"

DEFAULT_WEIGHTS = {"GPU": 1.0, "CPU": 0.8}
OTHER_MEDIUM_WEIGHT = 0.5

NO_MEDIA: dict[str, int] = {}
NO_PREFIX: list[tuple[str, ...]] = []


@dataclass(frozen=True)
class Evidence:
    """What the index knows for this request, per worker (absent: nothing there)."""

    states: Mapping[WorkerKey, str]
    session_by_medium: Mapping[WorkerKey, dict[str, int]]
    prefix_media: Mapping[WorkerKey, list[tuple[str, ...]]]


class Ranked(NamedTuple):
    """One line of the ranking (a tuple: a route builds `limit` of them per request, and a
    frozen dataclass costs several times as much to make)."""

    worker: WorkerKey
    state: str
    score: float
    session_score: float
    session_blocks: int
    prefix_blocks: int
    by_medium: dict[str, int]


class Weights:
    """Per-medium weights: the request's, over the defaults."""

    def __init__(self, overrides: dict[str, float] | None = None) -> None:
        self._weights = DEFAULT_WEIGHTS | (overrides or {})

    def __call__(self, medium: str) -> float:
        return self._weights.get(medium, OTHER_MEDIUM_WEIGHT)


class Candidates:
    """The workers a request may be sent to: as a set, in rank order (pod, dp_rank), and by
    pod. Built once per snapshot of the fleet where it is every connected worker
    (api/candidates.py), so a request does not pay for the fleet's size."""

    __slots__ = ("by_pod", "chosen", "ordered")

    def __init__(self, workers: Iterable[WorkerKey]) -> None:
        self.chosen = frozenset(workers)
        self.ordered = sorted(self.chosen)
        by_pod: dict[str, list[WorkerKey]] = {}
        for worker in self.ordered:
            by_pod.setdefault(worker.pod, []).append(worker)
        self.by_pod = by_pod

    def __len__(self) -> int:
        return len(self.ordered)


def rank(
    candidates: Candidates,
    evidence: Evidence,
    weights: Weights,
    *,
    by_prompt: bool,
    limit: int,
) -> list[Ranked]:
    """The best `limit` candidates, best first, deterministic for equal scores.

    Only those lines are built: a route over a large fleet ranks every worker, most of them
    with nothing of the session or prompt (score 0), and answers with a few. Those score 0
    alike and tie on the rest but their state and name, so only their `limit` first in that
    order can make the answer: they are found in the sorted candidates, the others never
    keyed (a key per worker was most of a route's ranking).
    """
    states, sessions, prefixes = evidence.states, evidence.session_by_medium, evidence.prefix_media
    held = _holding(candidates.chosen, sessions, prefixes)
    keys = []
    for worker in held:
        score, session = _scores(worker, evidence, weights, by_prompt)
        # A WorkerKey orders as (pod, dp_rank): the last tie-breakers.
        keys.append((-score, -session, states[worker] != LIVE, worker))
    if len(held) < len(candidates):
        live: list[WorkerKey] = []
        other: list[WorkerKey] = []
        for worker in candidates.ordered:
            if worker in held:
                continue
            if states[worker] == LIVE:
                live.append(worker)
                if len(live) == limit:
                    break  # the rest, live or not, come after these
            elif len(other) < limit:
                other.append(worker)
        keys += [(-0.0, -0.0, False, w) for w in live]
        keys += [(-0.0, -0.0, True, w) for w in other]
    return [_line(k[3], -k[0], -k[1], evidence) for k in heapq.nsmallest(limit, keys)]


def _holding(
    chosen: frozenset[WorkerKey],
    sessions: Mapping[WorkerKey, dict[str, int]],
    prefixes: Mapping[WorkerKey, list[tuple[str, ...]]],
) -> set[WorkerKey]:
    """The candidates holding any of the session or of the prompt's first block.

    Read from the evidence (a few workers hold anything), not by looking every candidate up
    in it: the store answers only for the workers holding the prompt's first block.
    """
    held = {w for w in sessions if w in chosen}
    held.update(w for w, media in prefixes.items() if media and w in chosen)
    return held


def _scores(
    worker: WorkerKey, evidence: Evidence, weights: Weights, by_prompt: bool
) -> tuple[float, float]:
    """(score, session score) of one worker, both rounded as the answer shows them."""
    session = 0.0
    for medium, n in evidence.session_by_medium.get(worker, NO_MEDIA).items():
        session += weights(medium) * n
    session = round(session, 6)
    if not by_prompt:
        return session, session
    prefix = 0.0
    best: dict[tuple[str, ...], float] = {}  # blocks share a few media sets
    for media in evidence.prefix_media.get(worker, NO_PREFIX):
        weight = best.get(media)
        if weight is None:
            weight = best[media] = max(map(weights, media))
        prefix += weight
    return round(prefix, 6), session


def _line(worker: WorkerKey, score: float, session: float, evidence: Evidence) -> Ranked:
    by_medium = evidence.session_by_medium.get(worker, NO_MEDIA)
    return Ranked(
        worker=worker,
        state=evidence.states[worker],
        score=score,
        session_score=session,
        session_blocks=sum(by_medium.values()),
        prefix_blocks=len(evidence.prefix_media.get(worker, NO_PREFIX)),
        by_medium=dict(sorted(by_medium.items())),
    )
