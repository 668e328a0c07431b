"""deploy/: every overlay renders with kubectl kustomize, every object is valid against the
Kubernetes schemas (kubernetes-validate), and the pieces fit: kvsi's commands and variables
pass the real CLI, ports and selectors meet, the sidecar and the central ingest reach the
engines' endpoints, Redis and the ZMQ ports admit only kvsi."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from kvsi.settings import Settings, unknown_variables
from tests.deploy.cli_check import run_kvsi
from tests.deploy.manifests import (
    NAMESPACE,
    OVERLAYS,
    POD_NAME,
    WORKLOADS,
    Obj,
    config_map,
    containers,
    events_config,
    expanded,
    is_kvsi,
    kustomized,
    materialized,
    one,
    pod_containers,
    port_of,
    rendered,
    selects,
)
from tests.deploy.paths import DEPLOY

VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
"""The oldest Kubernetes the manifests promise (NetworkPolicy endPort, policy/v1), the newest."""


def kvsi_settings(
    overlay: str, workload: str, monkeypatch: pytest.MonkeyPatch, files: Path
) -> tuple[Settings, Obj]:
    """What the kvsi container of `workload` would run with; Secret files go under `files`."""
    objs = rendered(overlay)
    ((owner, container),) = [
        (w, c) for w, c in containers(objs) if w["metadata"]["name"] == workload and is_kvsi(c)
    ]
    env = materialized(objs, owner, container, files)
    kvsi_env = {k: v for k, v in env.items() if k.startswith("KVSI_")}
    parsed = run_kvsi(expanded(container["args"], env), kvsi_env, monkeypatch)
    assert parsed.settings is not None
    return parsed.settings, container


CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "DynamoGraphDeployment"}
"""Custom resources: the Prometheus Operator's (components/monitoring), Dynamo's graph
(components/dynamo-worker). kubernetes-validate ships only the built-in kinds' schemas: the
tests that render them check their fields."""


def valid(objs: tuple[Obj, ...]) -> None:
    """Every built-in object of `objs` is valid for each of VERSIONS (strict: no unknown field)."""
    builtin = [o for o in objs if o["kind"] not in CRD_KINDS]
    assert builtin
    for obj in builtin:
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_is_valid_against_the_kubernetes_schemas(overlay: str) -> None:
    valid(rendered(overlay))


def test_the_base_applies_without_the_prometheus_operators_crds() -> None:
    for obj in kustomized(DEPLOY / "base"):
        for version in VERSIONS:  # a kind without a built-in schema fails here
            kubernetes_validate.validate(obj, version, strict=True)


def test_a_broken_manifest_is_rejected_by_the_schema_check() -> None:
    api = dict(one(rendered("sidecar"), "Deployment", "kvsi-api"))
    api["spec"] = dict(api["spec"], replica=3)  # a typo strict validation must catch
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(api, VERSIONS[-1], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_has_probes_resources_and_known_kvsi_variables(overlay: str) -> None:
    objs = rendered(overlay)
    assert unknown_variables(list(config_map(objs))) == []
    for workload, container in containers(objs):
        where = f"{workload['metadata']['name']}/{container['name']}"
        resources = container["resources"]
        assert resources["requests"]["cpu"] and resources["limits"]["memory"], where
        assert "livenessProbe" in container, where
        if container["name"] != "kvsi-ingest":  # see the sidecar patch for why not
            assert "readinessProbe" in container, where
        names = {p["name"] for p in container.get("ports", [])}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            port = container.get(probe, {}).get("httpGet", {}).get("port")
            assert port is None or port in names, f"{where}: {probe} port {port}"
        assert unknown_variables([v["name"] for v in container.get("env", [])]) == [], where
        if is_kvsi(container):
            security = container.get("securityContext", {}) | workload["spec"]["template"][
                "spec"
            ].get("securityContext", {})
            assert security["runAsNonRoot"] is True and security["runAsUser"] == 10001, where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_and_the_pdb_select_pods_and_name_their_ports(overlay: str) -> None:
    objs = rendered(overlay)
    pods = [
        (w["spec"]["template"]["metadata"]["labels"], w) for w in objs if w["kind"] in WORKLOADS
    ]
    for service in (o for o in objs if o["kind"] == "Service"):
        matched = [w for labels, w in pods if selects(service["spec"]["selector"], labels)]
        assert matched, f"service {service['metadata']['name']} selects no pod"
        ports = {
            p["name"]
            for w in matched
            for c in pod_containers(w["spec"]["template"]["spec"])
            for p in c.get("ports", [])
        }
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, (service["metadata"]["name"], port)
    pdb = one(objs, "PodDisruptionBudget", "kvsi-api")
    api = one(objs, "Deployment", "kvsi-api")
    assert selects(
        pdb["spec"]["selector"]["matchLabels"], api["spec"]["template"]["metadata"]["labels"]
    )
    assert api["spec"]["replicas"] >= 2 and pdb["spec"]["maxUnavailable"] < api["spec"]["replicas"]


MONITORED = {
    "external-redis": DEPLOY / "overlays" / "external-redis",
    "strict-cluster": Path(__file__).parent / "kustomize" / "strict-cluster",
}
"""Renderings with components/monitoring: a shipped overlay, and one that sets `release`."""


@pytest.mark.parametrize("name", MONITORED)
def test_the_service_monitor_scrapes_every_kvsi_process(name: str) -> None:
    objs = kustomized(MONITORED[name])
    monitor = one(objs, "ServiceMonitor", "kv-session-index")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    endpoints = {e["port"]: e["path"] for e in monitor["spec"]["endpoints"]}
    assert set(endpoints.values()) == {"/metrics"}
    scraped = {
        s["metadata"]["name"]
        for s in objs
        if s["kind"] == "Service"
        and selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
        and {p["name"] for p in s["spec"]["ports"]} & set(endpoints)
    }
    assert scraped == {"kvsi-api", "kvsi-sidecar-metrics"}
    release = {"external-redis": "kube-prometheus-stack", "strict-cluster": "prometheus"}[name]
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert one(objs, kind, "kv-session-index")["metadata"]["labels"]["release"] == release


def test_only_the_overlay_that_asks_for_monitoring_has_crd_objects() -> None:
    for overlay in ("sidecar", "central"):
        assert not [o for o in rendered(overlay) if o["kind"] in CRD_KINDS], overlay


def test_the_api_replicas_read_the_shared_index_and_ingest_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    settings, _ = kvsi_settings("sidecar", "kvsi-api", monkeypatch, tmp_path)
    assert settings.api and not settings.ingest and settings.port == 8000
    assert settings.host == "0.0.0.0" and settings.log_format == "json"
    assert settings.store == "redis://kvsi-redis:6379/0?prefix=kvsi"


def test_the_sidecar_dials_its_own_pods_engine_over_loopback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The strings fit: vLLM binds (tcp://*), the sidecar dials the same ports on the pod's
    loopback. tests/interop/test_rendered_manifests.py runs both to prove events flow."""
    objs = rendered("sidecar")
    settings, container = kvsi_settings("sidecar", "vllm", monkeypatch, tmp_path)
    assert not settings.api and settings.ingest and settings.metrics_port == 9090
    events = events_config(objs)
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    for field in ("endpoint", "replay_endpoint"):
        assert events[field].startswith("tcp://*:"), (
            f"{field}: vLLM binds only tcp://*:PORT; given a host it connects, as kvsi does"
        )
    (publisher,) = settings.publishers
    assert publisher.pod == POD_NAME, "the worker is named after the pod (downward API)"
    assert publisher.endpoint == f"tcp://127.0.0.1:{port_of(events['endpoint'])}"
    assert publisher.replay_endpoint == f"tcp://127.0.0.1:{port_of(events['replay_endpoint'])}"
    assert events["topic"].startswith(settings.topic)
    assert events["topic"].split("@") == ["kv", POD_NAME, "Qwen/Qwen3-0.6B"], (
        "llm-d's scorer parses kv@<pod>@<model>: three parts, the model last"
    )
    vllm = one(objs, "Deployment", "vllm")["spec"]["template"]
    assert vllm["metadata"]["labels"]["kv-session-index/redis-client"] == "true"
    assert {p["containerPort"] for p in container["ports"]} == {9090}


MAX_DP_RANKS = 8
"""Ranks per pod whose ZMQ ports the checks below cover (vLLM puts rank r at port + r)."""


def zmq_ports(objs: tuple[Obj, ...]) -> set[int]:
    """Every port the engines' publishers and replay sockets bind, rank 0 to MAX_DP_RANKS - 1."""
    events = events_config(objs)
    bases = (port_of(events["endpoint"]), port_of(events["replay_endpoint"]))
    return {base + rank for base in bases for rank in range(MAX_DP_RANKS)}


ANYWHERE = "anywhere"
"""A rule without `from`: every source, in every namespace and outside the cluster."""
NAMESPACE_AND_MONITORING = [
    {"podSelector": {}},
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
]


def engine_policies(objs: tuple[Obj, ...]) -> list[Obj]:
    """The NetworkPolicies selecting the vLLM pods (by the rendered pod template's labels)."""
    labels = one(objs, "Deployment", "vllm")["spec"]["template"]["metadata"]["labels"]
    policies = [
        o
        for o in objs
        if o["kind"] == "NetworkPolicy" and selects(o["spec"]["podSelector"]["matchLabels"], labels)
    ]
    assert all("Ingress" in p["spec"]["policyTypes"] for p in policies)
    return policies


def sources(policies: list[Obj], port: int, protocol: str = "TCP") -> list[object]:
    """Who the policies admit to `port`: each admitting rule's `from`, or ANYWHERE."""
    return [
        rule.get("from", ANYWHERE)
        for policy in policies
        for rule in policy["spec"]["ingress"]
        if opened(rule, port, protocol)
    ]


def opened(rule: Obj, port: int, protocol: str = "TCP") -> bool:
    """Whether a NetworkPolicy ingress rule admits `port` (a rule without ports: all)."""
    if "ports" not in rule:
        return True
    return any(
        p.get("protocol", "TCP") == protocol
        and ("port" not in p or p["port"] <= port <= p.get("endPort", p["port"]))
        for p in rule["ports"]
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_engines_keep_every_port_they_had_but_the_zmq_ones(overlay: str) -> None:
    """A policy that selects a pod isolates it: kvsi's must give back every port the engine
    served, from anywhere (vLLM's own, its metrics, a gateway's), to take nothing away."""
    objs = rendered(overlay)
    policies = engine_policies(objs)
    assert policies, "the ZMQ ports are guarded"
    kvsi_ports = zmq_ports(objs) | {9090}
    for port in range(1, 65536):
        if port not in kvsi_ports:
            assert ANYWHERE in sources(policies, port), port
    for protocol in ("UDP", "SCTP"):
        assert ANYWHERE in sources(policies, 53, protocol), protocol


EVENT_READERS = [{"podSelector": {"matchLabels": {"kv-session-index/event-reader": "true"}}}]
"""Another consumer of the engines' events (llm-d's scorer): the pods labelled so, only."""


@pytest.mark.parametrize("overlay", ["sidecar", "external-redis"])
def test_only_labelled_event_readers_reach_the_engines_wildcard_zmq_ports_in_sidecar_mode(
    overlay: str,
) -> None:
    objs = rendered(overlay)
    policies = engine_policies(objs)
    ports = zmq_ports(objs)
    assert {5557, 5657} <= ports
    for port in sorted(ports):
        assert sources(policies, port) == [EVENT_READERS], port
    assert sources(policies, 9090) == [NAMESPACE_AND_MONITORING], "the sidecar's metrics"


def test_a_cluster_with_its_own_policies_gets_only_kvsis_port_added() -> None:
    """With the catch-all rule dropped (deploy/README.md), the sidecar's policy only adds its
    metrics port, from the Prometheus namespace the cluster names, and the ZMQ ports for the
    pods labelled event readers."""
    objs = kustomized(Path(__file__).parent / "kustomize" / "strict-cluster")
    (policy,) = engine_policies(objs)
    rule, readers = policy["spec"]["ingress"]
    assert readers["from"] == EVENT_READERS
    assert rule["ports"] == [{"protocol": "TCP", "port": 9090}]
    (_, monitoring) = rule["from"]
    assert monitoring["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "observability"
    }


def test_central_mode_discovers_the_vllm_pods_with_the_rbac_it_needs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    objs = rendered("central")
    settings, _ = kvsi_settings("central", "kvsi-central", monkeypatch, tmp_path)
    discovery = settings.discovery
    assert discovery is not None and not settings.api and settings.metrics_port == 9090
    vllm = one(objs, "Deployment", "vllm")["spec"]["template"]
    assert selects(discovery.labels, vllm["metadata"]["labels"])
    assert discovery.namespace == NAMESPACE
    events = events_config(objs)
    assert events["endpoint"] == f"tcp://*:{discovery.events_port}", "reachable on the pod IP"
    assert events["replay_endpoint"] == f"tcp://*:{discovery.replay_port}"
    annotations = vllm["metadata"]["annotations"]
    assert int(annotations["kv-session-index/events-port"]) == discovery.events_port
    assert int(annotations["kv-session-index/replay-port"]) == discovery.replay_port

    deployment = one(objs, "Deployment", "kvsi-central")
    assert deployment["spec"]["replicas"] > 1 and discovery.split, "replicas split the pods"
    assert discovery.replica_id == POD_NAME, "each replica is named by its pod"
    central = deployment["spec"]["template"]
    account = central["spec"]["serviceAccountName"]
    binding = one(objs, "RoleBinding", "kvsi-discovery")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]
    role = one(objs, "Role", binding["roleRef"]["name"])
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]

    policies = engine_policies(objs)
    for port in sorted(zmq_ports(objs)):
        (allowed,) = sources(policies, port)
        source, *others = allowed  # type: ignore[misc]
        assert selects(source["podSelector"]["matchLabels"], central["metadata"]["labels"])
        assert others == EVENT_READERS, "no other pod but the labelled event readers"
    for port in (discovery.events_port, discovery.replay_port):
        assert port in zmq_ports(objs)


@pytest.mark.parametrize("overlay", ["sidecar", "central"])
def test_only_kvsi_pods_reach_the_development_redis(overlay: str) -> None:
    objs = rendered(overlay)
    policy = one(objs, "NetworkPolicy", "kvsi-redis")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    allowed = rule["from"][0]["podSelector"]["matchLabels"]
    for workload, container in containers(objs):
        if is_kvsi(container):
            labels = workload["spec"]["template"]["metadata"]["labels"]
            assert selects(allowed, labels), workload["metadata"]["name"]


def test_the_external_redis_overlay_drops_the_development_redis() -> None:
    objs = rendered("external-redis")
    assert not [o for o in objs if "redis" in o["metadata"]["name"] and o["kind"] != "ConfigMap"]
    assert "KVSI_STORE" not in config_map(objs), "the Secret names the Redis Cluster"


def test_the_dynamo_api_port_is_reachable_when_it_is_on() -> None:
    """Dynamo's indexer API on 8090 (KVSI_DYNAMO__PORT): the Service names it and the API's
    policy admits it from the namespace, like the REST port."""
    objs = rendered("sidecar")
    service = one(objs, "Service", "kvsi-api")
    assert {(p["name"], p["port"]) for p in service["spec"]["ports"]} >= {("dynamo", 8090)}
    policy = one(objs, "NetworkPolicy", "kvsi-api")
    assert sources([policy], 8090) == sources([policy], 8000) == [NAMESPACE_AND_MONITORING]
