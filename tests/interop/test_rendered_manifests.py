"""Every shipped overlay carries real events: vLLM's publisher and kvsi run as rendered.

Each overlay under deploy/overlays is rendered with `kubectl kustomize`. The vLLM container's
`--kv-events-config` (its args after the kubelet's `$(VAR)` expansion) builds vLLM's own
publisher through `EventPublisherFactory.create`, as vLLM's scheduler does, under a real
KVCacheManager serving sessions. The ingest container (the sidecar in the vLLM pod, or the
central deployment) and the API Deployment's container run as real `kvsi` processes with
their rendered args and environment. The worker must turn live in the API and equal the
block pool, with every session's residency; the first requests are served before kvsi
starts, so they reach it only through the rendered replay endpoint.

Only what Kubernetes provides is substituted, explicitly:
- the downward API: `$(POD_NAME)` and the namespace are a sample pod's (tests.deploy.manifests);
- the Secret `kvsi` the operator creates: a sample token, the store's URL as documented, its
  mounted files written under the test's temporary folder;
- DNS: a Redis Service's name and port (`KVSI_STORE`) resolve to the test's own Redis (a
  Redis Cluster for a `+cluster` URL) on loopback;
- the pod network: in central mode the Kubernetes API (tests/kvsi/fake_kube.py, reached
  through KUBECONFIG instead of the service account) lists the vLLM pod with the rendered
  pod template's labels and annotations and the IP 127.0.0.1;
- ports: each port the manifests fix (`FIXED_PORTS`) is renumbered to a free one, the same
  number everywhere it occurs (vLLM's endpoints, kvsi's args and variables, the pod's
  annotations), since a test cannot count on 5557 or 8000 being free. Hosts stay exactly
  as rendered: `*` where vLLM binds, 127.0.0.1 where the sidecar dials.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Mapping
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.deploy.manifests import (
    NAMESPACE,
    OVERLAYS,
    POD_NAME,
    SAMPLE_TOKENS,
    Obj,
    containers,
    events_config,
    expanded,
    is_kvsi,
    materialized,
    one,
    rendered,
)
from tests.e2e.services import Services, services, until
from tests.interop.engines import BLOCK_SIZE, KVEventsConfig, Turn, VllmWorker
from tests.interop.truth import caught_up, mismatches, session_residency, workers_view
from tests.kvsi.fake_kube import FakeKube, pod
from tests.ports import free_port_run
from tests.redis_servers import RedisClusterServers, RedisServer, require

pytestmark = [pytest.mark.interop, pytest.mark.e2e, pytest.mark.redis]

FIXED_PORTS = (5557, 5657, 8000, 9090)
"""The ports the manifests fix: the engine's PUB and replay ROUTER (DP rank 0), the API's,
the ingest process's metrics."""

WITHIN = 60.0
"""Seconds for processes to start and events to land (imports are slow on a loaded box)."""

WORKER = (POD_NAME, 0)
"""The sample vLLM pod's one DP rank (the manifests' dp-size is 1)."""


@dataclass(frozen=True)
class Command:
    """A kvsi container's command line and variables, as the kubelet would start it."""

    args: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class Shipped:
    """What one overlay runs, ports renumbered."""

    kv_events: KVEventsConfig
    """The vLLM container's `--kv-events-config`."""
    ingest: Command
    """The container that subscribes to the engine: the sidecar, or the central deployment."""
    api: Command
    """The API Deployment's container."""
    vllm_pod: Obj
    """The vLLM pod template's metadata (labels, annotations)."""

    @property
    def discovers(self) -> bool:
        return any(arg.startswith("--discover") for arg in self.ingest.args)


def renumbered(text: str, ports: Mapping[int, int]) -> str:
    """`text` with each whole number that is a key of `ports` replaced by its value."""
    return re.sub(
        r"(?<![\w.])\d+(?![\w.])", lambda m: str(ports.get(int(m.group()), m.group())), text
    )


def command(
    objs: tuple[Obj, ...], owner: tuple[Obj, Obj], ports: Mapping[int, int], files: Path
) -> Command:
    """The container's args and variables as the kubelet sets them, ports renumbered, the
    files it mounts from the Secret written under `files`."""
    workload, container = owner
    env = materialized(objs, workload, container, files)
    return Command(
        [renumbered(arg, ports) for arg in expanded(container.get("args", []), env)],
        {name: renumbered(value, ports) for name, value in env.items()},
    )


def shipped(overlay: str, ports: Mapping[int, int], files: Path) -> Shipped:
    objs = rendered(overlay)
    config = events_config(objs)
    for field in ("endpoint", "replay_endpoint"):
        config[field] = renumbered(config[field], ports)
    kvsi = {w["metadata"]["name"]: (w, c) for w, c in containers(objs) if is_kvsi(c)}
    api = kvsi.pop("kvsi-api")
    (ingest,) = kvsi.values()
    metadata = one(objs, "Deployment", "vllm")["spec"]["template"]["metadata"]
    annotations = {k: renumbered(v, ports) for k, v in metadata.get("annotations", {}).items()}
    return Shipped(
        kv_events=KVEventsConfig(**config),
        ingest=command(objs, ingest, ports, files),
        api=command(objs, api, ports, files),
        vllm_pod={"labels": metadata["labels"], "annotations": annotations},
    )


@contextmanager
def redis_behind(store: str) -> Iterator[str]:
    """A Redis of the store URL's kind on loopback (a Redis Cluster for `+cluster`); yields
    the URL with its host and port resolved to it, as the cluster's DNS would."""
    require("redis-server", "redis-cli")
    parts = urlsplit(store)
    if parts.scheme.endswith("+cluster"):
        cluster = RedisClusterServers()
        nodes, start = cluster.nodes, cluster.start
    else:
        server = RedisServer()
        nodes, start = [server], server.start
    try:
        start()
        yield parts._replace(netloc=f"127.0.0.1:{nodes[0].port}").geturl()
    finally:
        for node in nodes:
            node.remove()


def turns(sessions: list[str], seed: int) -> list[Turn]:
    """One turn per session: a shared two-block system prompt, then two blocks of its own."""
    rng = random.Random(seed)
    system = [rng.randrange(100, 32_000) for _ in range(2 * BLOCK_SIZE)]
    return [
        Turn(
            session,
            [*system, *(rng.randrange(100, 32_000) for _ in range(2 * BLOCK_SIZE))],
            [1, 2],
        )
        for session in sessions
    ]


def serve(worker: VllmWorker, work: list[Turn]) -> None:
    for turn in work:
        worker.submit(turn)
    worker.run_until_idle()
    worker.wait_sent()


async def api_client(run: Services, announced: str) -> httpx.AsyncClient:
    """A client of the API on loopback (it announces the address it binds, 0.0.0.0), with
    the bearer token of the sample Secret (ignored by the dev overlay's open API)."""
    client = httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{urlsplit(announced).port}",
        headers={"Authorization": f"Bearer {SAMPLE_TOKENS.strip()}"},
    )
    run.clients.append(client)
    return client


@pytest.mark.parametrize("overlay", OVERLAYS)
async def test_vllms_publisher_and_kvsi_run_as_rendered_carry_every_event(
    overlay: str, tmp_path: Path
) -> None:
    base = free_port_run(len(FIXED_PORTS))
    ports = {fixed: base + i for i, fixed in enumerate(FIXED_PORTS)}
    deployed = shipped(overlay, ports, tmp_path / "secret")
    workers = {WORKER: VllmWorker(POD_NAME, deployed.kv_events, num_blocks=64)}
    async with AsyncExitStack() as stack:
        stack.callback(workers[WORKER].close)
        store = stack.enter_context(redis_behind(deployed.ingest.env["KVSI_STORE"]))
        ingest_env = deployed.ingest.env | {"KVSI_STORE": store}
        if deployed.discovers:
            kube = await stack.enter_async_context(FakeKube(NAMESPACE))
            kube.put(pod(POD_NAME, ip="127.0.0.1", namespace=NAMESPACE, **deployed.vllm_pod))
            kubeconfig = tmp_path / "kubeconfig"
            kubeconfig.write_text(kube.kubeconfig())
            ingest_env |= {"KUBECONFIG": str(kubeconfig)}

        serve(workers[WORKER], turns(["sess-a", "sess-b"], seed=1))  # before kvsi: replay only
        run = await stack.enter_async_context(services())
        ingest = run.command("ingest", deployed.ingest.args, ingest_env)
        api = run.command("api", deployed.api.args, deployed.api.env | {"KVSI_STORE": store})
        client = await api_client(run, await api.serving())

        async def landed() -> bool:
            assert ingest.running, f"exited with {ingest.proc.returncode}\n{ingest.tail()}"
            return await caught_up(client, workers)

        await until(landed, WITHIN, "replayed batches applied", run)
        serve(workers[WORKER], turns(["sess-b", "sess-c", "sess-d"], seed=2))
        await until(landed, WITHIN, "live batches applied", run)
        assert await mismatches(client, workers) == []
        worker = (await workers_view(client))[WORKER]
        assert worker["state"] == "live" and worker["blocks"] == len(workers[WORKER].resident())
    sessions = session_residency(workers[WORKER].published)
    assert set(sessions) == {"sess-a", "sess-b", "sess-c", "sess-d"}
