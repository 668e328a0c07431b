"""The `kvsi` command as a user runs it: a real process, real sockets, real HTTP."""

from __future__ import annotations

import asyncio
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
from typer.testing import CliRunner

from kvsi.cli import app, parse_pods
from kvsi.errors import StartupError
from kvsi.settings import load_settings
from kvsi.simulator.engine import SimulatedEngine
from kvsi.simulator.publisher import SimulatedPublisher
from kvsi.store.memory import MemoryStore
from kvsi.store.select import open_store
from kvsi.subscriber.pool import StreamPool
from kvsi.subscriber.stream import PublisherSpec
from kvsi.tail import tail
from tests.children import tied
from tests.ports import free_port

pytestmark = pytest.mark.e2e

KVSI = [sys.executable, "-m", "kvsi"]


def get(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_demo_serves_live_pods_and_sessions_then_stops_on_ctrl_c() -> None:
    port = free_port()
    proc = subprocess.Popen(
        tied([*KVSI, "serve", "--demo", "--port", str(port)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        pods: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            try:
                pods = get(f"{base}/v1/pods")["pods"]  # type: ignore[index]
                if len(pods) == 3 and all(
                    p["state"] == "live" and int(p["blocks"]) > 0  # type: ignore[call-overload]
                    for p in pods
                ):
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert len(pods) == 3 and all(p["state"] == "live" for p in pods), pods
        listed = get(f"{base}/v1/sessions?limit=3")["sessions"]  # type: ignore[index]
        assert listed
        view = get(f"{base}/v1/sessions/{listed[0]['session_id']}")
        assert view["total_blocks"] >= 1  # type: ignore[index]
    finally:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, output
    assert f"serving on http://127.0.0.1:{port}" in output


async def test_tail_prints_decoded_events() -> None:
    engine = SimulatedEngine(num_blocks=64)
    async with SimulatedPublisher("tcp://127.0.0.1:*") as publisher:
        lines: list[str] = []
        task = asyncio.create_task(tail(publisher.endpoint, "", 2, out=lines.append))
        for _ in range(50):
            await asyncio.sleep(0.05)
            await publisher.publish(engine.run_request("sess-T", list(range(40))))
            if task.done():
                break
        await asyncio.wait_for(task, 5)
    assert any("BlockStored session=sess-T medium=GPU group=0" in line for line in lines)


def test_pod_flags_parse_and_bad_ones_are_rejected() -> None:
    parsed = parse_pods(["pod-a=tcp://h:5557", "pod-a/1=tcp://h:5558"], ["pod-a=tcp://h:6000"])
    assert parsed == [
        {
            "pod": "pod-a",
            "endpoint": "tcp://h:5557",
            "dp_rank": 0,
            "replay_endpoint": "tcp://h:6000",
        },
        {"pod": "pod-a", "endpoint": "tcp://h:5558", "dp_rank": 1},
    ]
    result = CliRunner().invoke(app, ["serve", "--pod", "no-endpoint"])
    assert result.exit_code != 0 and "expected NAME=ENDPOINT" in result.output
    result = CliRunner().invoke(app, ["serve", "--pod", "a=tcp://h:1", "--replay", "b=tcp://h:2"])
    assert result.exit_code != 0 and "no --pod named 'b'" in result.output


def test_settings_precedence_flags_over_env_over_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "kvsi.toml"
    config.write_text(
        'port = 9001\nhost = "0.0.0.0"\ntopic = "kv@"\n'
        '[[publishers]]\npod = "pod-a"\nendpoint = "tcp://10.0.0.1:5557"\n'
    )
    monkeypatch.setenv("KVSI_PORT", "9002")
    monkeypatch.setenv("KVSI_TOPIC", "env-topic")
    settings = load_settings(config, topic="flag-topic")
    assert settings.host == "0.0.0.0"
    assert settings.port == 9002
    assert settings.topic == "flag-topic"
    assert settings.publishers[0].endpoint == "tcp://10.0.0.1:5557"


def test_settings_reject_bad_values_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="must start with tcp://"):
        load_settings(None, publishers=[{"pod": "pod-a", "endpoint": "http://x"}])
    with pytest.raises(StartupError, match="does not exist"):
        load_settings(tmp_path / "missing.toml")
    with pytest.raises(StartupError, match="pod"):
        load_settings(None, publishers=[{"pod": "Pod_A", "endpoint": "tcp://x:1"}])


def test_unknown_store_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="valid: memory"):
        open_store("postgres://x")


def test_module_entry_point_exists() -> None:
    result = subprocess.run(
        [*KVSI, "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        env=os.environ | {"COLUMNS": "120"},
    )
    assert result.returncode == 0
    for command in ("serve", "simulate", "tail"):
        assert command in result.stdout


def test_simulate_and_serve_as_two_processes() -> None:
    """`kvsi simulate` in one process, `kvsi serve --pod ...` in another, over tcp."""
    simulator = subprocess.Popen(
        tied([*KVSI, "simulate", "--pods", "1", "--base-port", "0", "--duration", "60"]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    service: subprocess.Popen[bytes] | None = None
    try:
        assert simulator.stdout is not None
        line = simulator.stdout.readline()  # the simulator logs its endpoints first
        endpoints = dict(re.findall(r"(endpoint|replay_endpoint)=(tcp://\S+)", line))
        assert set(endpoints) == {"endpoint", "replay_endpoint"}, line
        api_port = free_port()
        service = subprocess.Popen(
            tied(
                [
                    *KVSI,
                    "serve",
                    "--port",
                    str(api_port),
                    "--pod",
                    f"pod-a={endpoints['endpoint']}",
                    "--replay",
                    f"pod-a={endpoints['replay_endpoint']}",
                ]
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 45
        pods: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            try:
                pods = get(f"http://127.0.0.1:{api_port}/v1/pods")["pods"]  # type: ignore[index]
                if pods and int(pods[0]["blocks"]) > 0:  # type: ignore[call-overload]
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert pods and pods[0]["pod"] == "pod-a" and int(pods[0]["blocks"]) > 0  # type: ignore[call-overload]
    finally:
        running = [p for p in (service, simulator) if p is not None]
        for proc in running:
            proc.send_signal(signal.SIGINT)
        for proc in running:
            proc.communicate(timeout=20)
    assert service is not None and service.returncode == 0


async def test_ipc_publisher_is_ingested(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/kv.sock"
    store = MemoryStore()
    engine = SimulatedEngine(num_blocks=64)
    async with SimulatedPublisher(endpoint) as publisher:
        pool = StreamPool([PublisherSpec("pod-a", endpoint)], store)
        await pool.start()
        try:
            for _ in range(100):
                await publisher.publish(engine.run_request("sess-ipc", list(range(64))))
                await asyncio.sleep(0.05)
                view = await store.get_session("sess-ipc")
                if view is not None:
                    break
        finally:
            await pool.stop()
    assert view is not None and view.total_blocks == 4
