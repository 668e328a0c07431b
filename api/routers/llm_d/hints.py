"""Session hints: the header a router copies onto a request to send it where the session's
KV cache is, in the form llm-d's endpoint picker reads.

Imports neither zmq nor subscriber/ nor HTTP. Picks with api.ranking, so a hint names the
worker `/v1/route` ranks first for the session without a prompt. Formats:

- `llm-d`: `x-session-token` = base64 (standard, padded) of `<namespace>/<endpoint>`, the
  endpoint named as the picker names it (`<pod>-rank-<i>`), which its session-affinity
  scorer and filter (strategy `encoded_endpoint_header`) compare with each candidate's
  namespaced name;
- `label`: `x-kvsi-pod` = the pod's name, for a header-label-affinity-scorer comparing it
  with a pod label that holds the pod's name.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

from kvsi.api.ranking import Candidates, Evidence, Ranked, Weights, rank
from kvsi.store.model import WorkerKey

HintFormat = Literal["llm-d", "label"]

LIVE = "live"


@dataclass(frozen=True)
class HintOptions:
    """How workers are named for the router (settings `llm_d`, kvsi/settings.py)."""

    namespace: str = "default"
    pod_namespaces: Mapping[str, str] = field(default_factory=dict)
    endpoint: str = "{pod}-rank-{rank}"
    header: str = "x-session-token"
    label_header: str = "x-kvsi-pod"

    def per_pod(self, form: HintFormat) -> bool:
        """Whether the hint names a pod rather than one of its ranks: a label is per pod, and
        an endpoint template without `{rank}` names every rank of a pod alike."""
        return form == "label" or "{rank" not in self.endpoint

    def namespace_of(self, pod: str) -> str:
        """The namespace of the longest matching `pod_namespaces` prefix, else `namespace`."""
        prefixes = [p for p in self.pod_namespaces if pod.startswith(p)]
        return self.pod_namespaces[max(prefixes, key=len)] if prefixes else self.namespace


class Hint(BaseModel):
    """Where to send the request, as the header a router copies onto it."""

    format: HintFormat
    pod: str | None = Field(description="The pod the hint names; null: no hint.")
    dp_rank: int | None = Field(
        description="Its data-parallel rank; null when the hint names the whole pod (a "
        "`label` hint, or an endpoint template without `{rank}`) or there is no hint."
    )
    target: str | None = Field(
        description="What the header names, decoded: `<namespace>/<endpoint>` for `llm-d`, "
        "the pod for `label`; null: no hint."
    )
    headers: dict[str, str] = Field(
        description="Headers to set on the request; empty when no live candidate holds any "
        "of the session (route as usual)."
    )
    session_blocks: int = Field(description="The session's blocks where the hint points.")
    state: str | None = Field(
        description="The stream state there (`live` only if every rank counted is live)."
    )


class SessionHint(Hint):
    """`GET /v1/sessions/{session_id}/hint`: the hint for the session's next request."""

    session_id: str


def token(namespace: str, endpoint: str) -> str:
    """llm-d's session token: standard base64 of the endpoint's namespaced name."""
    return base64.b64encode(f"{namespace}/{endpoint}".encode()).decode()


def best_for_session(
    candidates: Candidates,
    states: Mapping[WorkerKey, str],
    by_session: Mapping[WorkerKey, dict[str, int]],
    per_pod: bool,
) -> Ranked | None:
    """The candidate holding most of the session (blocks weighted by medium, as `/v1/route`
    scores a session without a prompt); None if no candidate holds any of it. Only the
    candidates the session names are ranked (per pod: every candidate rank of their pods),
    the rest of the fleet never looked at: they would score 0."""
    keys = [w for w in by_session if w in candidates.chosen]
    if per_pod:
        ranks = [k for pod in dict.fromkeys(w.pod for w in keys) for k in candidates.by_pod[pod]]
        keys, states, by_session = _pods(ranks, states, by_session)
    evidence = Evidence(states, by_session, {})
    best = rank(Candidates(keys), evidence, Weights(), by_prompt=False, limit=1)
    return best[0] if best and best[0].session_blocks > 0 else None


def hint_for(form: HintFormat, options: HintOptions, best: Ranked | None) -> Hint:
    """The hint naming `best`'s pod (per pod) or worker; an empty one for None."""
    if best is None:
        return Hint(
            format=form,
            pod=None,
            dp_rank=None,
            target=None,
            headers={},
            session_blocks=0,
            state=None,
        )
    pod, dp_rank = best.worker
    if form == "label":
        target, header, value = pod, options.label_header, pod
    else:
        namespace = options.namespace_of(pod)
        endpoint = options.endpoint.format(pod=pod, rank=dp_rank)
        target, header = f"{namespace}/{endpoint}", options.header
        value = token(namespace, endpoint)
    return Hint(
        format=form,
        pod=pod,
        dp_rank=None if options.per_pod(form) else dp_rank,
        target=target,
        headers={header: value},
        session_blocks=best.session_blocks,
        state=best.state,
    )


def route_hint(
    form: HintFormat | None, options: HintOptions, ranked: list[Ranked]
) -> dict[str, object] | None:
    """`/v1/route`'s `hint`: for its first worker, unless it holds nothing of the session or
    the prompt (then no worker does); None when not asked for."""
    if form is None or not ranked:
        return None
    best = ranked[0]
    if best.score == 0 and best.session_blocks == 0:
        return None
    return hint_for(form, options, best).model_dump()


def _pods(
    workers: list[WorkerKey],
    states: Mapping[WorkerKey, str],
    by_session: Mapping[WorkerKey, dict[str, int]],
) -> tuple[list[WorkerKey], dict[WorkerKey, str], dict[WorkerKey, dict[str, int]]]:
    """The workers folded into one key per pod (rank 0): the session's blocks summed over its
    ranks, `live` only if every rank is (so a pod's counts read as exact only if they are)."""
    pods: dict[WorkerKey, str] = {}
    blocks: dict[WorkerKey, dict[str, int]] = {}
    for worker in workers:
        key = WorkerKey(worker.pod, 0)
        state = states[worker]
        pods[key] = state if pods.get(key, LIVE) == LIVE else pods[key]
        for medium, n in by_session.get(worker, {}).items():
            media = blocks.setdefault(key, {})
            media[medium] = media.get(medium, 0) + n
    return list(pods), pods, blocks
