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

from dataclasses import dataclass

from store.model import WorkerKey

DEFAULT_WEIGHTS = {"GPU": 1.0, "CPU": 0.8}
OTHER_MEDIUM_WEIGHT = 0.5


@dataclass(frozen=True)
class Evidence:
    """What the index knows of one candidate worker for this request."""

    worker: WorkerKey
    state: str
    session_by_medium: dict[str, int]
    prefix_media: list[tuple[str, ...]]


@dataclass(frozen=True)
class Ranked:
    """One line of the ranking."""

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


def rank(candidates: list[Evidence], weights: Weights, *, by_prompt: bool) -> list[Ranked]:
    """Candidates best first, deterministic for equal scores."""
    lines = [_score(c, weights, by_prompt) for c in candidates]
    lines.sort(
        key=lambda r: (
            -r.score,
            -r.session_score,
            r.state != "live",
            r.worker.pod,
            r.worker.dp_rank,
        )
    )
    return lines


def _score(c: Evidence, weights: Weights, by_prompt: bool) -> Ranked:
    prefix = sum(max(weights(m) for m in media) for media in c.prefix_media)
    session = sum(weights(m) * n for m, n in c.session_by_medium.items())
    return Ranked(
        worker=c.worker,
        state=c.state,
        score=round(prefix if by_prompt else session, 6),
        session_score=round(session, 6),
        session_blocks=sum(c.session_by_medium.values()),
        prefix_blocks=len(c.prefix_media),
        by_medium=dict(sorted(c.session_by_medium.items())),
    )
