"""The overlays as `kubectl kustomize` renders them, and what the kubelet makes of a container.

Shared by the deploy tests (schemas, wiring, policies) and the interop tier, which runs
vLLM's publisher and kvsi with the rendered values. Reads YAML only; imports nothing of kvsi.
"""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from typing import Any

import yaml

from tests.deploy.paths import DEPLOY, tool

Obj = dict[str, Any]

OVERLAYS = ("sidecar", "central", "external-redis")
POD_NAME = "vllm-7d9c4f-x2x8q"
"""metadata.name of a sample pod, as the downward API gives it."""
NAMESPACE = "llm"
WORKLOADS = ("Deployment", "StatefulSet")
VLLM_LABELS = {"app.kubernetes.io/name": "vllm"}
"""The label every manifest selects the vLLM pods by."""


@cache
def rendered(overlay: str) -> tuple[Obj, ...]:
    """Every object of `deploy/overlays/<overlay>`, as `kubectl kustomize` renders them."""
    result = subprocess.run(
        [tool("kubectl"), "kustomize", str(DEPLOY / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def one(objs: tuple[Obj, ...], kind: str, name: str) -> Obj:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def containers(objs: tuple[Obj, ...]) -> list[tuple[Obj, Obj]]:
    """(workload, container) for every container of every workload."""
    return [
        (w, c)
        for w in objs
        if w["kind"] in WORKLOADS
        for c in w["spec"]["template"]["spec"]["containers"]
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
        o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("kvsi")
    ]
    data: dict[str, str] = found["data"]
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
        else:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


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
