"""How long does one `kvsi serve` take to follow N workers exactly, and what does it hold?

Run: `.venv/bin/python bench/many_workers.py [--workers 0,100,1000] [--runs 3]` (see
bench/README.md). Two processes on loopback: this one runs N simulated vLLM 0.33 publishers
(PUB + replay ROUTER each, `simulator.fleet.SimulatedFleet`) that publish `--batches`
batches before the service starts; `kvsi serve` (memory store) subscribes with one
`--pod/--replay` pair per publisher and recovers everything by replay. Prints, per N and
run, the seconds from the spawn to serving HTTP and to every worker `live` with exactly its
engine's blocks, then the service's RSS and open file descriptors; then the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import httpx

from kvsi.logs import configure_logging
from kvsi.simulator.fleet import SimulatedFleet

REPO = Path(__file__).resolve().parent.parent
SERVING = re.compile(r"serving on (http://\S+)")
WITHIN = 300.0
"""Seconds a run may take before it is reported as failed."""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def open_files(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def exact(client: httpx.AsyncClient, fleet: SimulatedFleet, names: list[str]) -> bool:
    """Every worker of `names` is listed, live, with all its publisher sent and its engine's
    block count (nothing else listed)."""
    pods = {p["pod"]: p for p in (await client.get("/v1/pods")).json()["pods"]}
    if set(pods) != set(names):
        return False
    for name, pod in pods.items():
        sent = fleet.publisher(name).next_seq
        if (
            pod["state"] != "live"
            or pod["last_seq"] != (sent - 1 if sent else None)
            or pod["blocks"] != len(fleet.resident(name))
        ):
            return False
    return True


async def one_run(workers: int, batches: int) -> dict[str, Any]:
    fleet = SimulatedFleet(pods=max(workers, 1), sessions=max(workers, 1), requests_per_batch=1)
    await fleet.start()
    try:
        await fleet.run(0, max_batches=batches)
        args = [sys.executable, "-m", "kvsi", "serve", "--port", "0", "--store", "memory"]
        for pod, endpoint, replay in fleet.endpoints()[:workers]:  # 0: the baseline
            args += ["--pod", f"{pod}={endpoint}", "--replay", f"{pod}={replay}"]
        with tempfile.NamedTemporaryFile("w+", suffix=".log") as log:
            began = time.monotonic()
            proc = spawn(args, log)
            try:
                return await measure(proc, Path(log.name), fleet, fleet.pods[:workers], began)
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    finally:
        await fleet.close()


def spawn(args: list[str], log: IO[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        args,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env=os.environ | {"KVSI_LOG_LEVEL": "warning", "PYTHONUNBUFFERED": "1"},
    )


def serving_url(proc: subprocess.Popen[bytes], log: Path) -> str | None:
    """The URL the service announced, None before; fails if it exited."""
    output = log.read_text()
    if proc.poll() is not None:
        raise RuntimeError(f"kvsi exited with {proc.returncode}:\n{output}")
    found = SERVING.search(output)
    return None if found is None else found.group(1)


async def measure(
    proc: subprocess.Popen[bytes],
    log: Path,
    fleet: SimulatedFleet,
    names: list[str],
    began: float,
) -> dict[str, Any]:
    async with asyncio.timeout(WITHIN):
        while (url := serving_url(proc, log)) is None:  # noqa: ASYNC110 (a file to poll)
            await asyncio.sleep(0.05)
        serving = time.monotonic() - began
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            while not await exact(client, fleet, names):  # noqa: ASYNC110 (polls over HTTP)
                await asyncio.sleep(0.1)
            done = time.monotonic() - began
            ready = (await client.get("/readyz")).status_code
    await asyncio.sleep(2.0)  # settled: replays done, nothing in flight
    return {
        "serving_s": serving,
        "exact_s": done,
        "readyz": ready,
        "rss_mib": rss_mib(proc.pid),
        "fds": open_files(proc.pid),
    }


async def main(args: argparse.Namespace) -> None:
    configure_logging("warning", "console")
    counts = [int(n) for n in args.workers.split(",")]
    results: dict[int, list[dict[str, Any]]] = {n: [] for n in counts}
    for run in range(args.runs):
        for workers in counts:
            result = await one_run(workers, args.batches)
            results[workers].append(result)
            print(f"run {run + 1} workers {workers}: {result}", flush=True)
    base = statistics.median(r["fds"] for r in results[counts[0]])
    print("\nmedians: workers | serving s | exact s | RSS MiB | fds | fds per worker added")
    for workers, runs in results.items():
        fds = statistics.median(r["fds"] for r in runs)
        per = (fds - base) / (workers - counts[0]) if workers != counts[0] else 0.0
        print(
            f"{workers} | {statistics.median(r['serving_s'] for r in runs):.1f} "
            f"| {statistics.median(r['exact_s'] for r in runs):.1f} "
            f"| {statistics.median(r['rss_mib'] for r in runs):.0f} | {fds:.0f} | {per:.2f}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="0,100,1000", help="comma-separated counts")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batches", type=int, default=5, help="batches each publisher buffers")
    asyncio.run(main(parser.parse_args()))
