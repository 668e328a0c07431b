"""The ingest sidecar fits any vLLM workload: a native sidecar (an init container that
restarts always) in the shipped overlays, the same container as a plain one for clusters
older than 1.29, added to whatever Deployment or StatefulSet carries the label (a layer
picks a workload by name by labelling it), to the pods of llm-d's ModelService chart through
its Helm post-renderer, and to Dynamo's decode workers through their graph. Each is rendered
by kubectl kustomize and schema-checked."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from tests.deploy.cli_check import run_kvsi
from tests.deploy.manifests import (
    POD_NAME,
    Obj,
    environment,
    expanded,
    kustomized,
    one,
    port_of,
    rendered,
    selects,
)
from tests.deploy.paths import DEPLOY, tool
from tests.deploy.test_kubernetes import valid

HERE = Path(__file__).parent
BY_NAME = HERE / "kustomize" / "by-name"
DYNAMO = HERE / "kustomize" / "dynamo"
MODELSERVICE = HERE / "fixtures" / "llm-d-modelservice.yaml"
SIDECAR_LABEL = {"kv-session-index/ingest": "sidecar"}


def pod_spec(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    spec: Obj = one(objs, kind, name)["spec"]["template"]["spec"]
    return spec


def ingest_of(spec: Obj, where: str) -> Obj:
    """The kvsi-ingest container of a pod spec, from `initContainers` or `containers`."""
    (found,) = [c for c in spec.get(where, []) if c["name"] == "kvsi-ingest"]
    return found


def post_rendered(chart_output: str) -> tuple[Obj, ...]:
    """deploy/llm-d/modelservice/post-render.sh as Helm runs it: manifests in, manifests out."""
    result = subprocess.run(
        [str(DEPLOY / "llm-d" / "modelservice" / "post-render.sh")],
        input=chart_output,
        capture_output=True,
        text=True,
        timeout=120,
        env={"KUBECTL": tool("kubectl"), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def test_the_shipped_sidecar_is_a_native_sidecar_started_before_the_engine() -> None:
    spec = pod_spec(rendered("sidecar"), "Deployment", "vllm")
    sidecar = ingest_of(spec, "initContainers")
    assert sidecar["restartPolicy"] == "Always", "an init container that keeps running"
    assert "kvsi-ingest" not in {c["name"] for c in spec["containers"]}
    assert [c["name"] for c in spec["containers"]] == ["vllm"], "the engine is left alone"


def test_the_plain_form_is_the_same_container_beside_the_engine() -> None:
    native = ingest_of(pod_spec(rendered("sidecar"), "Deployment", "vllm"), "initContainers")
    plain = ingest_of(pod_spec(kustomized(BY_NAME), "StatefulSet", "my-engine"), "containers")
    assert plain == {k: v for k, v in native.items() if k != "restartPolicy"}


def test_a_workload_picked_by_name_gets_the_sidecar_and_no_other_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objs = kustomized(BY_NAME)
    valid(objs)
    engine = one(objs, "StatefulSet", "my-engine")["spec"]["template"]
    assert [c["name"] for c in engine["spec"]["containers"]] == ["kvsi-ingest", "engine"]
    assert selects(SIDECAR_LABEL, engine["metadata"]["labels"])
    gateway = pod_spec(objs, "Deployment", "gateway")
    assert [c["name"] for c in gateway["containers"]] == ["gateway"]
    assert "initContainers" not in gateway
    service = one(objs, "Service", "kvsi-sidecar-metrics")
    assert selects(service["spec"]["selector"], engine["metadata"]["labels"])
    sidecar = ingest_of(engine["spec"], "containers")
    parsed = run_kvsi(expanded(sidecar["args"], environment(objs, sidecar)), {}, monkeypatch)
    assert parsed.settings is not None
    (publisher,) = parsed.settings.publishers
    assert publisher.pod == POD_NAME
    (flag,) = engine["spec"]["containers"][1]["args"]
    config = json.loads(flag.removeprefix("--kv-events-config="))
    assert publisher.endpoint == f"tcp://127.0.0.1:{port_of(config['endpoint'])}"


def test_llm_d_modelservice_pods_get_the_sidecar_through_helms_post_renderer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objs = post_rendered(MODELSERVICE.read_text())
    valid(objs)
    for role in ("decode", "prefill"):
        template = one(objs, "Deployment", f"qwen-ms-{role}")["spec"]["template"]
        sidecar = ingest_of(template["spec"], "initContainers")
        assert sidecar["restartPolicy"] == "Always", role
        assert [c["name"] for c in template["spec"]["containers"]] == ["vllm"], role
        assert selects(SIDECAR_LABEL, template["metadata"]["labels"]), role
        env = environment(objs, sidecar)
        parsed = run_kvsi(expanded(sidecar["args"], env), {}, monkeypatch)
        assert parsed.settings is not None and not parsed.settings.api, role
    decode = pod_spec(objs, "Deployment", "qwen-ms-decode")
    names = [c["name"] for c in decode["initContainers"]]
    assert sorted(names) == ["kvsi-ingest", "routing-proxy"], "llm-d's own sidecar stays"
    vllm_args = decode["containers"][0]["args"]
    (config,) = [a for a in vllm_args if a.startswith("--kv-events-config=")]
    assert '"endpoint": "tcp://*:5557"' in config, "the sidecar dials what the chart binds"
    assert one(objs, "Deployment", "kvsi-api")["spec"]["replicas"] >= 2, "the API comes along"
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "ServiceAccount"] == ["qwen-ms"]


def test_only_the_plain_form_validates_on_a_cluster_without_native_sidecars() -> None:
    """Kubernetes 1.27 knows no container `restartPolicy`: the native form is refused there,
    the plain form is valid."""
    native = one(rendered("sidecar"), "Deployment", "vllm")
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicy"):
        kubernetes_validate.validate(native, "1.27.0", strict=True)
    plain = one(kustomized(BY_NAME), "StatefulSet", "my-engine")
    kubernetes_validate.validate(plain, "1.27.0", strict=True)


def test_dynamo_decode_workers_get_the_same_sidecar_dialing_dynamos_event_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    objs = kustomized(DYNAMO)
    valid(objs)
    (graph,) = [o for o in objs if o["kind"] == "DynamoGraphDeployment"]
    worker = graph["spec"]["services"]["VllmDecodeWorker"]
    assert worker["extraPodSpec"]["mainContainer"]["command"] == ["python3", "-m", "dynamo.vllm"]
    assert "initContainers" not in graph["spec"]["services"]["Frontend"].get("extraPodSpec", {})
    sidecar = ingest_of(worker["extraPodSpec"], "initContainers")
    native = ingest_of(pod_spec(rendered("sidecar"), "Deployment", "vllm"), "initContainers")
    assert {k: v for k, v in sidecar.items() if k != "args"} == {
        k: v for k, v in native.items() if k != "args"
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": POD_NAME}}
    kubernetes_validate.validate(
        pod | {"spec": {"initContainers": [sidecar], "containers": [{"name": "m", "image": "i"}]}},
        "1.29.0",
        strict=True,
    )
    labels = worker["extraPodMetadata"]["labels"]
    assert selects(one(objs, "Service", "kvsi-sidecar-metrics")["spec"]["selector"], labels)
    parsed = run_kvsi(expanded(sidecar["args"], environment(objs, sidecar)), {}, monkeypatch)
    assert parsed.settings is not None
    (publisher,) = parsed.settings.publishers
    assert publisher.endpoint == "tcp://127.0.0.1:20080", "DYN_VLLM_KV_EVENT_PORT's default"
    assert publisher.replay_endpoint is None, "Dynamo's worker binds no replay endpoint"
