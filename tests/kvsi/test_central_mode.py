"""`kvsi serve --discover` as deployed: a real process finds its Kubernetes API server the
way kubectl does (KUBECONFIG), subscribes to the pods it lists, forgets a deleted one after
the grace time, and refuses to start without a cluster to ask."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kvsi.simulator.fleet import SimulatedFleet
from tests.kvsi.fake_kube import FakeKube, pod
from tests.ports import free_port, free_port_run
from tests.waiting import eventually

pytestmark = pytest.mark.e2e


async def test_a_central_process_ingests_discovered_pods_and_forgets_deleted_ones(
    tmp_path: Path,
) -> None:
    base = free_port_run(2)
    log = tmp_path / "kvsi.log"
    async with FakeKube() as kube, SimulatedFleet(pods=["vllm-a"], base_port=base) as fleet:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(kube.kubeconfig())
        ports = {"events-port": str(base), "replay-port": str(base + 1)}
        kube.put(pod("vllm-a", annotations={f"kv-session-index/{k}": v for k, v in ports.items()}))
        runner = fleet.run_in_background(40.0)
        port = free_port()
        env = os.environ | {
            "KUBECONFIG": str(kubeconfig),
            "KVSI_DISCOVERY__GRACE_SECONDS": "0.5",
            "KVSI_LOG_FORMAT": "json",
        }
        argv = ["serve", "--discover", "app.kubernetes.io/name=vllm", "--port", str(port)]
        with log.open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "kvsi", *argv, stdout=out, stderr=out, env=env
            )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:

                async def live() -> bool:
                    assert proc.returncode is None, log.read_text()
                    try:
                        pods = (await http.get("/v1/pods")).json()["pods"]
                    except httpx.TransportError:
                        return False
                    return [(p["pod"], p["state"], p["blocks"] > 0) for p in pods] == [
                        ("vllm-a", "live", True)
                    ]

                await eventually(live, within=45)
                metrics = (await http.get("/metrics")).text
                assert "kvsi_discovery_pods 1.0" in metrics
                assert 'kvsi_discovery_changes_total{action="started"} 1.0' in metrics

                kube.delete("vllm-a")

                async def forgotten() -> bool:
                    pods: list[object] = (await http.get("/v1/pods")).json()["pods"]
                    return pods == []

                await eventually(forgotten, within=15)
        finally:
            fleet.stop()
            await asyncio.gather(runner, return_exceptions=True)
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 30)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert '"event": "discovery.worker_forgotten"' in log.read_text()


def test_central_mode_without_a_cluster_to_ask_refuses_to_start(tmp_path: Path) -> None:
    env = os.environ | {"KUBECONFIG": str(tmp_path / "missing"), "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "kvsi", "serve", "--discover", "app=vllm", "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "kvsi: error: --discover needs a Kubernetes configuration" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
