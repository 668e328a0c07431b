"""Central mode against a Kubernetes API server on loopback (tests/kvsi/fake_kube.py): the
lightkube list+watch adapter, and the whole loop driving a real StreamPool subscribed to a
simulated fleet of vLLM pods."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
from lightkube import AsyncClient, KubeConfig
from prometheus_client import REGISTRY

from kvsi.discovery import PodEvent, PodInfo, PodSnapshot, run_discovery, watch_pods
from kvsi.settings import DiscoveryConfig
from kvsi.simulator.fleet import SimulatedFleet
from kvsi.store.memory import MemoryStore
from kvsi.store.model import WorkerKey, WorkerState
from kvsi.subscriber import metrics
from kvsi.subscriber.pool import StreamPool
from tests.kvsi.fake_kube import FakeKube, pod
from tests.kvsi.paths import RECORDED_WATCH
from tests.ports import free_port_run
from tests.waiting import eventually

LABELS = {"app.kubernetes.io/name": "vllm"}


def client_of(kube: FakeKube) -> AsyncClient:
    return AsyncClient(config=KubeConfig.from_dict(json.loads(kube.kubeconfig())))


async def take(source: AsyncIterator[PodSnapshot | PodEvent], n: int) -> list[object]:
    got: list[object] = []
    async with asyncio.timeout(10):
        while len(got) < n:
            got.append(await anext(source))
    return got


async def test_the_adapter_lists_then_watches_from_the_listed_version() -> None:
    async with FakeKube() as kube:
        kube.put(pod("vllm-a"))
        kube.put(pod("other", labels={"app.kubernetes.io/name": "redis"}))
        source = watch_pods(client_of(kube), DiscoveryConfig(labels=LABELS))
        (snapshot,) = await take(source, 1)
        assert snapshot == PodSnapshot((PodInfo("vllm-a", "127.0.0.1", True, {}),))

        listed_at = str(kube.version)
        pending = asyncio.ensure_future(take(source, 2))
        await eventually(lambda: _true(kube.watching == 1))
        kube.put(pod("vllm-b", annotations={"kv-session-index/dp-size": "2"}))
        kube.delete("vllm-a")
        added, deleted = await pending
        assert added == PodEvent(
            "ADDED", PodInfo("vllm-b", "127.0.0.1", True, {"kv-session-index/dp-size": "2"})
        )
        assert isinstance(deleted, PodEvent) and deleted.kind == "DELETED"
        assert deleted.pod.name == "vllm-a"
        watch = next(r for r in kube.requests if r.get("watch") == "true")
        assert watch["resourceVersion"] == listed_at
        assert watch["labelSelector"] == "app.kubernetes.io/name=vllm"
        await source.aclose()


async def test_an_expired_watch_lists_again_and_the_snapshot_shows_a_missed_delete() -> None:
    async with FakeKube() as kube:
        kube.put(pod("vllm-a"))
        kube.put(pod("vllm-b"))
        source = watch_pods(client_of(kube), DiscoveryConfig(labels=LABELS))
        (first,) = await take(source, 1)
        assert isinstance(first, PodSnapshot) and len(first.pods) == 2
        pending = asyncio.ensure_future(take(source, 1))
        await eventually(lambda: _true(kube.watching == 1))
        kube.delete("vllm-a", notify=False)  # the event is lost...
        kube.expire_watches()  # ...and the watch's version is compacted away (410)
        (again,) = await pending
        assert again == PodSnapshot((PodInfo("vllm-b", "127.0.0.1", True, {}),))
        await source.aclose()


async def test_a_recorded_watch_stream_decodes_through_the_client() -> None:
    async with FakeKube() as kube:
        kube.recorded = [json.loads(line) for line in RECORDED_WATCH.read_text().splitlines()]
        source = watch_pods(client_of(kube), DiscoveryConfig(labels=LABELS))
        items = await take(source, 1 + len(kube.recorded))
        await source.aclose()
    events = [e for e in items if isinstance(e, PodEvent)]
    assert [(e.kind, e.pod.name, e.pod.ip, e.pod.running) for e in events] == [
        ("ADDED", "vllm-7d9c-abcde", None, False),
        ("MODIFIED", "vllm-7d9c-abcde", "10.244.1.17", True),
        ("ADDED", "vllm-7d9c-fghij", "10.244.2.9", True),
        ("MODIFIED", "vllm-7d9c-abcde", "10.244.1.17", True),
        ("MODIFIED", "vllm-7d9c-abcde", "10.244.1.17", False),
        ("DELETED", "vllm-7d9c-abcde", "10.244.1.17", False),
    ]
    assert events[2].pod.annotations["kv-session-index/dp-size"] == "2"


@pytest.mark.e2e
async def test_discovered_pods_become_live_workers_and_gone_ones_are_forgotten() -> None:
    """Two simulated vLLM pods with two DP ranks each, found through the API server: every
    rank is ingested; a deleted pod is shown disconnected at once and removed after grace; a
    pod deleted while the watch was down goes too, once the watch lists again."""
    dp = 2
    base = free_port_run(2 * dp * 2)
    config = DiscoveryConfig(labels=LABELS, grace_seconds=0.5)
    store = MemoryStore()
    async with AsyncExitStack() as stack:
        kube = await stack.enter_async_context(FakeKube())
        fleet = await stack.enter_async_context(
            SimulatedFleet(pods=["vllm-a", "vllm-b"], dp_size=dp, base_port=base, sessions=8)
        )
        for i, name in enumerate(fleet.pods):
            first = base + 2 * dp * i  # the fleet's PUB ports, then its ROUTER ports
            ports = {"events-port": str(first), "replay-port": str(first + dp), "dp-size": "2"}
            kube.put(pod(name, annotations={f"kv-session-index/{k}": v for k, v in ports.items()}))
        pool = StreamPool([], store)
        await pool.start()
        stack.push_async_callback(pool.stop)
        source = watch_pods(client_of(kube), config)
        loop = asyncio.create_task(run_discovery(config, pool, source))
        stack.push_async_callback(_cancel, loop)
        runner = fleet.run_in_background(50.0)
        stack.push_async_callback(_cancel, runner)

        async def states() -> dict[WorkerKey, tuple[WorkerState, int]]:
            return {
                WorkerKey(w.pod, w.dp_rank): (w.status.state, w.blocks)
                for w in await store.list_workers()
            }

        async def all_live_with_blocks() -> bool:
            now = await states()
            keys = {WorkerKey(p, r) for p in fleet.pods for r in range(dp)}
            return set(now) == keys and all(
                s is WorkerState.LIVE and n > 0 for s, n in now.values()
            )

        await eventually(all_live_with_blocks, within=20)

        kube.delete("vllm-b")
        await eventually(lambda: _true(len(pool.streams) == 2))
        gone = (await states()).get(WorkerKey("vllm-b", 0))
        assert gone is not None and gone[0] is WorkerState.DISCONNECTED, "shown gone at once"
        received = _fleet_messages()
        await eventually(lambda: _no_pod(store, "vllm-b"), within=5)
        # Its series go with it (pod names churn), its counts stay in the fleet totals.
        await eventually(lambda: _true(not any(w.startswith("vllm-b/") for w in _series())))
        assert _fleet_messages() >= received > 0

        kube.delete("vllm-a", notify=False)
        kube.expire_watches()
        await eventually(lambda: _no_pod(store, "vllm-a"), within=10)
        assert pool.streams == []


def _series() -> list[str]:
    return list(metrics.INGEST.workers())


def _fleet_messages() -> float:
    return REGISTRY.get_sample_value("kvsi_fleet_messages_total") or 0.0


async def _no_pod(store: MemoryStore, name: str) -> bool:
    return all(w.pod != name for w in await store.list_workers())


async def _true(value: bool) -> bool:
    return value


async def _cancel(task: asyncio.Task[object]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
