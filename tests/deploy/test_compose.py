"""docker-compose.yml: valid Compose (the `docker compose` plugin where it exists, the
Compose spec's JSON schema always), and every kvsi service's command and KVSI_* variable
accepted by the real CLI and settings; the fleets' ports agree on both ends."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from kvsi.settings import Settings, unknown_variables
from tests.deploy.cli_check import run_kvsi
from tests.deploy.paths import ROOT, tool

COMPOSE = ROOT / "docker-compose.yml"


def services() -> dict[str, dict[str, Any]]:
    loaded = yaml.safe_load(COMPOSE.read_text())  # merge keys (<<) resolved
    found: dict[str, dict[str, Any]] = loaded["services"]
    return found


def kvsi_services() -> dict[str, dict[str, Any]]:
    """The services that run this project's image."""
    return {name: s for name, s in services().items() if s.get("build") == "."}


def serve_settings(name: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    service = services()[name]
    parsed = run_kvsi(service["command"], service.get("environment", {}), monkeypatch)
    assert parsed.settings is not None, f"{name} does not run kvsi serve"
    return parsed.settings


def compose_plugin() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    return probe.returncode == 0


def test_the_file_matches_the_compose_specification() -> None:
    result = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_docker_compose_config_accepts_every_profile() -> None:
    if not compose_plugin():
        pytest.skip("no `docker compose` plugin here; the schema test checks the same file")
    result = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "--profile", "*", "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_every_kvsi_command_and_variable_is_accepted_by_the_cli_and_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert set(kvsi_services()) == {"vllm-sim", "kvsi", "demo", "kvsi-vllm"}
    for name, service in kvsi_services().items():
        environment = service.get("environment", {})
        assert unknown_variables(list(environment)) == [], name
        parsed = run_kvsi(service["command"], environment, monkeypatch)
        if parsed.settings is not None:
            assert parsed.settings.host == "0.0.0.0", f"{name}: reachable from the host"


def test_the_laptop_fleet_is_ingested_into_redis_with_replay(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sim = run_kvsi(services()["vllm-sim"]["command"], {}, monkeypatch).simulate
    assert sim is not None and sim["host"] == "0.0.0.0", "reachable from the kvsi container"
    settings = serve_settings("kvsi", monkeypatch)
    assert settings.store.startswith("redis://redis:6379/")
    # `kvsi simulate`: pod i publishes on base + 2i, replays on base + 2i + 1.
    expected = [
        (
            f"tcp://vllm-sim:{sim['base_port'] + 2 * i}",
            f"tcp://vllm-sim:{sim['base_port'] + 2 * i + 1}",
        )
        for i in range(sim["pods"])
    ]
    assert [(p.endpoint, p.replay_endpoint) for p in settings.publishers] == expected
    assert "redis" in services()["kvsi"]["depends_on"]


def test_the_gpu_profile_turns_vllm_events_on_and_points_kvsi_at_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    vllm = services()["vllm"]
    assert vllm["profiles"] == ["gpu"] and vllm["entrypoint"] == ["vllm", "serve"]
    (flag,) = [a for a in vllm["command"] if a.startswith("--kv-events-config=")]
    events = json.loads(flag.split("=", 1)[1])
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    pub_port = int(events["endpoint"].rsplit(":", 1)[1])
    replay_port = int(events["replay_endpoint"].rsplit(":", 1)[1])
    assert events["endpoint"].startswith("tcp://*:"), "bound on every interface of the container"
    gpu = vllm["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"]

    settings = serve_settings("kvsi-vllm", monkeypatch)
    (publisher,) = settings.publishers
    assert publisher.endpoint == f"tcp://vllm:{pub_port}"
    assert publisher.replay_endpoint == f"tcp://vllm:{replay_port}"
    assert events["topic"].startswith(settings.topic), "kvsi's topic filter lets vLLM's through"
    assert settings.store != serve_settings("kvsi", monkeypatch).store, "its own key prefix"
