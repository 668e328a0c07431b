"""Central replicas splitting the discovered pods (issue 16 item 3), as real `kvsi serve
--discover` processes on a private redis-server and a Kubernetes API on loopback
(tests/kvsi/fake_kube.py), fed by an in-process simulated fleet whose engines are the truth.

Three replicas follow each pod exactly once between them; one killed (SIGKILL: its record
is left to run out) has its pods taken over by the survivors, one stopped (SIGINT: it
leaves the roster) hands its pods to the last; the index then equals the engines' truth
with no batch lost.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from kvsi.simulator.fleet import SimulatedFleet
from tests.e2e.services import (
    Service,
    Services,
    caught_up,
    fleet_of,
    metrics,
    pods,
    redis_server,
    services,
    store_url,
    unique_prefix,
    until,
)
from tests.e2e.truth import mismatches
from tests.kvsi.fake_kube import FakeKube, pod

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(240)]

FLEET = {"pods": 6, "sessions": 36, "seed": 11, "num_blocks": 512, "migrate_prob": 0.1}
"""Small engines (512 blocks) so traffic evicts and sessions migrate: removals matter too."""

RATE = 20.0
"""Batches per second per pod while replicas come and go."""

BEAT, TTL = 0.2, 1.5
"""The replicas' beat and record TTL: short, so a lost replica's pods move within seconds."""

TAKEOVER_WITHIN = 30.0
"""Bound on a handover (the TTL and a beat, plus a loaded box's slack), not a target."""


def followed(service: Service) -> set[str]:
    """The workers a replica follows, from its log (started, then stopped or released)."""
    following: set[str] = set()
    for line in service.output().splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        event = record.get("event")
        if event == "discovery.worker_started":
            following.add(record["worker"])
        elif event in ("discovery.worker_stopped", "discovery.worker_released"):
            following.discard(record["worker"])
    return following


def one_owner_each(replicas: Sequence[Service], workers: set[str]) -> list[set[str]] | None:
    """Each replica's workers if every worker has exactly one follower among `replicas`."""
    shares = [followed(r) for r in replicas]
    if sum(len(s) for s in shares) != len(workers) or set().union(*shares) != workers:
        return None
    return shares


def start_replica(run: Services, name: str, store: str, kubeconfig: Path) -> Service:
    env = {
        "KUBECONFIG": str(kubeconfig),
        "KVSI_LOG_FORMAT": "json",
        "KVSI_DISCOVERY__SPLIT": "true",
        "KVSI_DISCOVERY__REPLICA_ID": name,
        "KVSI_DISCOVERY__BEAT_SECONDS": str(BEAT),
        "KVSI_DISCOVERY__REPLICA_TTL_SECONDS": str(TTL),
    }
    selector = "app.kubernetes.io/name=vllm"
    args = ["serve", "--discover", selector, "--store", store, "--host", "127.0.0.1", "--port", "0"]
    return run.command(name, args, env)


def publish_pods(kube: FakeKube, fleet: SimulatedFleet) -> None:
    for name, endpoint, replay in fleet.endpoints():
        ports = {"events-port": urlsplit(endpoint).port, "replay-port": urlsplit(replay).port}
        kube.put(pod(name, annotations={f"kv-session-index/{k}": str(v) for k, v in ports.items()}))


async def test_replicas_split_the_pods_and_hand_them_over_without_a_lost_batch(
    tmp_path: Path,
) -> None:
    with redis_server() as redis:
        async with FakeKube() as kube, fleet_of(**FLEET) as fleet, services() as run:
            kubeconfig = tmp_path / "kubeconfig"
            kubeconfig.write_text(kube.kubeconfig())
            publish_pods(kube, fleet)
            workers = {f"{name}/0" for name in fleet.pods}
            store = store_url(redis, unique_prefix())
            replicas = [start_replica(run, f"central-{i}", store, kubeconfig) for i in range(3)]
            clients = [await run.client(r) for r in replicas]
            runner = fleet.run_in_background(RATE)
            try:

                async def split(among: list[Service]) -> list[set[str]] | None:
                    """Each pod's one follower, once every replica in `among` counts them
                    all (a replica starting alone follows every pod for a beat)."""
                    for client in (clients[replicas.index(r)] for r in among):
                        seen = await metrics(client)
                        if seen.get(("kvsi_discovery_replicas", ())) != len(among):
                            return None
                    return one_owner_each(among, workers)

                shares = await until(partial(split, replicas), 60, "one follower per pod", run)
                for client, share in zip(clients, shares, strict=True):
                    samples = await metrics(client)
                    assert samples[("kvsi_discovery_owned_pods", ())] == len(share)
                    assert samples[("kvsi_discovery_replicas", ())] == 3
                    assert samples[("kvsi_discovery_pods", ())] == len(workers)

                # SIGKILL the replica with the most pods: no leave, its record runs out
                victim = max(range(3), key=lambda i: len(shares[i]))
                assert shares[victim], "the victim must follow some pods"
                replicas[victim].kill()
                survivors = [r for i, r in enumerate(replicas) if i != victim]
                alive = [c for i, c in enumerate(clients) if i != victim]
                after = await until(
                    partial(split, survivors), TAKEOVER_WITHIN, "the survivors took over", run
                )
                for before, now in zip(
                    [s for i, s in enumerate(shares) if i != victim], after, strict=True
                ):
                    assert before <= now, "a survivor kept its own pods"

                # SIGINT another: it leaves the roster, the last replica takes everything
                assert survivors[0].stop() == 0, survivors[0].tail()
                assert '"event": "discovery.replica_left"' in survivors[0].output()
                await until(
                    partial(split, survivors[1:]), TAKEOVER_WITHIN, "the last took all", run
                )
            finally:
                fleet.stop()
                await runner
            last = alive[1]
            await until(partial(caught_up, last, fleet), 60, "caught up", run)
            found = await pods(last)
            states = {p: (w["state"], w["batches_lost"]) for p, w in found.items()}
            assert states == {p: ("live", 0) for p in fleet.pods}, run.logs()
            assert await mismatches(last, fleet) == [], run.logs()
