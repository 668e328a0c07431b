"""Compare what the REST API says with a simulated fleet's own truth.

Imports the API over HTTP only (httpx), never the store's internals.
"""

from __future__ import annotations

import httpx

from kvsi.simulator.fleet import SimulatedFleet
from kvsi.store.hashtext import parse_hash


async def listing(client: httpx.AsyncClient, url: str, **filters: str) -> set[int | bytes]:
    """Every hash of a paged block listing, each exactly once."""
    hashes: list[int | bytes] = []
    cursor: str | None = None
    while True:
        params = filters | {"limit": "1000"} | ({"cursor": cursor} if cursor else {})
        response = await client.get(url, params=params)
        response.raise_for_status()
        body = response.json()
        hashes.extend(parse_hash(h) for h in body["block_hashes"])
        cursor = body["next_cursor"]
        if cursor is None:
            assert len(hashes) == len(set(hashes)), f"{url}: a hash came twice"
            return set(hashes)


async def session_ids(client: httpx.AsyncClient) -> set[str]:
    """Every session the API lists, walking the pages."""
    out: set[str] = set()
    cursor: str | None = None
    while True:
        params = {"limit": "1000"} | ({"cursor": cursor} if cursor else {})
        body = (await client.get("/v1/sessions", params=params)).json()
        out.update(s["session_id"] for s in body["sessions"])
        cursor = body["next_cursor"]
        if cursor is None:
            return out


async def mismatches(client: httpx.AsyncClient, fleet: SimulatedFleet) -> list[str]:
    """Where the API disagrees with the engines' pools and session residency; [] if none."""
    problems: list[str] = []
    sessions: set[str] = set()
    for pod in fleet.pods:
        truth = fleet.resident(pod)
        got = await listing(client, f"/v1/pods/{pod}/blocks")
        if got != truth:
            problems.append(f"{pod}: {len(got - truth)} extra, {len(truth - got)} missing")
        sessions.update(fleet.session_residency(pod))
    indexed = await session_ids(client)
    for session_id in sorted(indexed | sessions):
        view = (await client.get(f"/v1/sessions/{session_id}")).json()
        # Pods that hold nothing of it but lost some are listed too (with 0 blocks).
        got_counts = {p["pod"]: p["blocks"] for p in view["pods"] if p["blocks"]}
        want_counts = {pod: len(b) for (pod, _), b in fleet.session_truth(session_id).items()}
        if got_counts != want_counts:
            problems.append(f"{session_id}: pods {got_counts} != truth {want_counts}")
    for session_id in sorted(sessions):
        for (pod, _rank), truth in fleet.session_truth(session_id).items():
            got = await listing(client, f"/v1/sessions/{session_id}/blocks", pod=pod)
            if got != truth:
                problems.append(f"{session_id}@{pod}: got {len(got)}, truth {len(truth)}")
    return problems
