"""The overlays as `kubectl kustomize` renders them, and what the kubelet makes of a container.

Shared by the deploy tests (schemas, wiring, policies) and the interop tier, which runs
vLLM's publisher and kvsi with the rendered values. Reads YAML only; imports nothing of kvsi.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.paths import DEPLOY, tool

Obj = dict[str, Any]

OVERLAYS = ("sidecar", "central", "external-redis", "dev")
SHIPPED = ("sidecar", "central", "external-redis")
"""The overlays for a cluster (dev: a trial, with an open API)."""
SAMPLE_TOKENS = "sample-token\n"
"""The `api-tokens` of the Secret `kvsi` an operator creates (deploy/README.md, "Secrets")."""
DEV_REDIS = "redis://kvsi-redis:6379/0?prefix=kvsi"
EXTERNAL_REDIS = "redis+cluster://redis-cluster.redis.svc.cluster.local:6379?prefix=kvsi"
"""Its `store`: the development Redis where the overlay brings it, else a Redis Cluster."""
POD_NAME = "vllm-7d9c4f-x2x8q"
"""metadata.name of a sample pod, as the downward API gives it."""
NAMESPACE = "llm"
WORKLOADS = ("Deployment", "StatefulSet")
VLLM_LABELS = {"app.kubernetes.io/name": "vllm"}
"""The label every manifest selects the vLLM pods by."""


@cache
def rendered(overlay: str) -> tuple[Obj, ...]:
    """Every object of `deploy/overlays/<overlay>`, as `kubectl kustomize` renders them."""
    return kustomized(DEPLOY / "overlays" / overlay)


@cache
def kustomized(directory: Path) -> tuple[Obj, ...]:
    """Every object of the kustomization in `directory`, as `kubectl kustomize` renders them."""
    result = subprocess.run(
        [tool("kubectl"), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def one(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def pod_containers(pod_spec: Obj) -> list[Obj]:
    """A pod's init containers (native sidecars among them), then its containers."""
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def containers(objs: tuple[Obj, ...]) -> list[tuple[Obj, Obj]]:
    """(workload, container) for every container of every workload, init containers too."""
    return [
        (w, c)
        for w in objs
        if w["kind"] in WORKLOADS
        for c in pod_containers(w["spec"]["template"]["spec"])
    ]


def container(objs: tuple[Obj, ...], workload: str, name: str) -> Obj:
    (found,) = [
        c for w, c in containers(objs) if w["metadata"]["name"] == workload and c["name"] == name
    ]
    return found


def is_kvsi(container: Obj) -> bool:
    return str(container["image"]).startswith("kv-session-index")


def config_map(objs: tuple[Obj, ...]) -> dict[str, str]:
    (found,) = [
        o
        for o in objs
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("kvsi-config")
    ]
    data: dict[str, str] = found["data"]
    return data


def secret(objs: tuple[Obj, ...], name: str) -> dict[str, str]:
    """The Secret `name` (its generated name, from the name kvsi's manifests use): the one the
    overlay makes, else the sample an operator creates."""
    made = [o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"] == name]
    if not made:
        assert name == "kvsi", f"Secret {name} is neither made nor documented"
        dev = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "kvsi-redis"]
        return {"store": DEV_REDIS if dev else EXTERNAL_REDIS, "api-tokens": SAMPLE_TOKENS}
    (found,) = made
    data: dict[str, str] = found.get("stringData") or {
        k: base64.b64decode(v).decode() for k, v in found.get("data", {}).items()
    }
    return data


def environment(objs: tuple[Obj, ...], container: Obj) -> dict[str, str]:
    """The container's variables as the kubelet sets them (downward API: a sample pod)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env |= config_map(objs) if "configMapRef" in source else {}
    fields = {"metadata.name": POD_NAME, "metadata.namespace": NAMESPACE}
    for var in container.get("env", []):
        if "value" in var:  # a reference to a variable defined before it is expanded
            env[var["name"]] = expanded([var["value"]], env)[0]
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secret(objs, ref["name"])[ref["key"]]
        else:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def secret_files(objs: tuple[Obj, ...], workload: Obj, container: Obj) -> dict[str, str]:
    """Path -> content of each file the container sees from a mounted Secret."""
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"].get("volumes", [])}
    files = {}
    for mount in container.get("volumeMounts", []):
        source = volumes[mount["name"]].get("secret")
        if source is not None:
            data = secret(objs, source["secretName"])
            for item in source.get("items") or [{"key": k, "path": k} for k in data]:
                files[f"{mount['mountPath']}/{item['path']}"] = data[item["key"]]
    return files


def expanded(args: list[str], env: dict[str, str]) -> list[str]:
    """$(VAR) references as the kubelet expands them; an undefined one fails the test."""

    def value(match: re.Match[str]) -> str:
        assert match.group(1) in env, f"$({match.group(1)}) is not defined"
        return env[match.group(1)]

    return [re.sub(r"\$\((\w+)\)", value, arg) for arg in args]


def command_line(objs: tuple[Obj, ...], container: Obj) -> list[str]:
    """The container's args as the kubelet passes them (after the image's entrypoint)."""
    return expanded(container.get("args", []), environment(objs, container))


def events_config(objs: tuple[Obj, ...]) -> Obj:
    """What the vLLM container's `vllm serve` gets as `--kv-events-config`."""
    (vllm,) = [c for _, c in containers(objs) if c["name"] == "vllm"]
    flag = "--kv-events-config="
    (value,) = [a.removeprefix(flag) for a in command_line(objs, vllm) if a.startswith(flag)]
    config: Obj = json.loads(value)
    return config


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def materialized(
    objs: tuple[Obj, ...], workload: Obj, container: Obj, root: Path
) -> dict[str, str]:
    """The container's variables, with each file it gets from a Secret written under `root`
    and the variables naming such a file pointed at the copy."""
    env = environment(objs, container)
    for path, content in secret_files(objs, workload, container).items():
        copy = root / path.lstrip("/")
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(content)
        env = {k: str(copy) if v == path else v for k, v in env.items()}
    return env
