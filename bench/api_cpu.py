"""How much CPU does `kvsi serve` spend per API request, kind by kind?

Run: `.venv/bin/python bench/api_cpu.py [--trees A,B] [--requests 3000] [--rps 300]` (see
bench/README.md). Loopback only, stops by itself. This process runs route_latency.py's 100
simulated vLLM publishers with its prefill (100,000 sessions, 1,000,000 entries); one
`kvsi serve --store memory` per source tree in `--trees` subscribes to them and builds the
index by replay. Then, per run, tree and request kind (`route`, `session`, `hint`), in an
order alternating between runs: the service's CPU time (utime + stime of /proc/<pid>/stat)
over `--idle` s without requests, then over bench/loadgen.py sending `--requests` requests
of that kind at `--rps`. A request's CPU is the second less the first's rate over the same
wall time, divided by the requests: the API's own cost, whatever the process does
meanwhile. First with ingest idle (the publishers silent), then with `--ingest-rate`
block-events/s flowing to every service. Prints each measurement, then the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processes import REPO, background
from route_latency import (
    BLOCKS_PER_SESSION,
    Fleet,
    free_port,
    session_hashes,
    settled,
    until_built,
    worker_of,
)

from kvsi.logs import configure_logging

KINDS = ("route", "session", "hint")
"""The kinds measured by default; `healthz` (the HTTP floor: a request that reads nothing)
can be asked too."""
TICK = os.sysconf("SC_CLK_TCK")
BUILD_SECONDS = 600


@dataclass(frozen=True)
class Service:
    """One `kvsi serve` under test: the tree it runs from, its process and port."""

    tree: Path
    pid: int
    port: int

    @property
    def name(self) -> str:
        return self.tree.name

    def cpu(self) -> float:
        """CPU seconds the process has used (every thread, user and system)."""
        return sum(self.cpu_by_mode())

    def cpu_by_mode(self) -> tuple[float, float]:
        """CPU seconds the process has used in user mode and in the kernel (every thread)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) / TICK, int(fields[12]) / TICK


def requests_of(kind: str, port: int, sessions: int, workers: int, count: int) -> str:
    """Loadgen's input: `count` requests of one kind for random sessions, each with the
    start of its right answer."""
    rng = random.Random(3)
    host = f"Host: 127.0.0.1:{port}\r\n"
    lines = []
    for _ in range(count):
        s = rng.randrange(sessions)
        pod = f"vllm-{worker_of(s, workers)}"
        if kind == "route":
            prompt = [str(h) for h in session_hashes(s)] + ["1", "2"]
            body = json.dumps({"session_id": f"sess-{s}", "block_hashes": prompt})
            request = (
                f"POST /v1/route HTTP/1.1\r\n{host}Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}"
            )
            expect = f'{{"ranking":[{{"pod":"{pod}","dp_rank":0,'
        elif kind == "session":
            request = f"GET /v1/sessions/sess-{s} HTTP/1.1\r\n{host}\r\n"
            expect = f'{{"session_id":"sess-{s}","total_blocks":{BLOCKS_PER_SESSION},'
        elif kind == "hint":
            request = f"GET /v1/sessions/sess-{s}/hint?format=llm-d HTTP/1.1\r\n{host}\r\n"
            expect = f'{{"format":"llm-d","pod":"{pod}","dp_rank":0,'
        else:
            request, expect = f"GET /healthz HTTP/1.1\r\n{host}\r\n", '{"status":"ok"}'
        lines.append(json.dumps({"kind": kind, "request": request, "expect": expect}))
    return "\n".join(lines) + "\n"


async def cpu_per_request(
    args: argparse.Namespace, service: Service, kind: str, workers: int
) -> dict[str, Any]:
    """One measurement: the service's CPU rate without requests, then over `--requests`
    requests of `kind`; µs of CPU per request above that rate."""
    async with asyncio.timeout(BUILD_SECONDS):
        await settled(f"http://127.0.0.1:{service.port}")
    cpu, at = service.cpu(), time.monotonic()
    await asyncio.sleep(args.idle)
    idle_rate = (service.cpu() - cpu) / (time.monotonic() - at)
    requests = requests_of(kind, service.port, args.sessions, workers, args.requests)
    (user, system), at = service.cpu_by_mode(), time.monotonic()
    cpu = user + system
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(Path(__file__).with_name("loadgen.py")),
        "--port", str(service.port), "--rps", str(args.rps),
        "--duration", str(args.requests / args.rps), "--connections", str(args.connections),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    out, _ = await proc.communicate(requests.encode())
    user_after, system_after = service.cpu_by_mode()
    used, wall = user_after + system_after - cpu, time.monotonic() - at
    if proc.returncode != 0:
        raise RuntimeError(f"loadgen exited with {proc.returncode}")
    report = json.loads(out)["kinds"][kind]
    answered = report["answered"]
    return {
        "tree": service.name,
        "kind": kind,
        "us": (used - idle_rate * wall) / answered * 1e6,
        "total_us": used / answered * 1e6,
        "system_share": (system_after - system) / used if used else 0.0,
        "idle_share": idle_rate,
        "p50_ms": report["p50_ms"],
        "p99_ms": report["p99_ms"],
        "errors": report["errors"],
        "error_examples": report["error_examples"],
    }


@contextlib.contextmanager
def services(trees: list[Path], publishers: list[dict[str, Any]]) -> Iterator[list[Service]]:
    """`kvsi serve --store memory` from each tree (with the tree's own .venv if it has one),
    all subscribed to `publishers`; stopped after."""
    with contextlib.ExitStack() as stack:
        out = []
        for tree in trees:
            venv = tree / ".venv" / "bin" / "python"
            python = str(venv) if venv.exists() else sys.executable
            port = free_port()
            env = {"KVSI_PUBLISHERS": json.dumps(publishers), "PYTHONPATH": str(tree)}
            argv = [python, "-m", "kvsi", "serve", "--port", str(port), "--store", "memory"]
            proc, _ = stack.enter_context(background(argv, env, "kvsi-cpu-", cwd=tree))
            out.append(Service(tree, proc.pid, port))
        yield out


async def phase(
    args: argparse.Namespace, name: str, running: list[Service], workers: int
) -> list[dict[str, Any]]:
    """`--runs` runs over every service and kind, the order alternating between runs."""
    results = []
    pairs = [(s, k) for k in args.kinds.split(",") for s in running]
    for n in range(args.runs):
        for service, kind in pairs if n % 2 == 0 else pairs[::-1]:
            r = await cpu_per_request(args, service, kind, workers) | {"ingest": name, "run": n}
            print(
                f"{name} run {n + 1} {r['tree']:>12} {kind:>7}: {r['us']:7.0f} µs/request "
                f"(with the idle rate {r['total_us']:7.0f}, {r['system_share']:.0%} in the "
                f"kernel; idle {r['idle_share']:.0%} of a core)  p50 {r['p50_ms']:.2f} ms "
                f"p99 {r['p99_ms']:.2f} ms  errors "
                f"{sum(r['errors'].values())} {r['error_examples'] or ''}  load "
                f"{os.getloadavg()[0]:.2f}",
                flush=True,
            )
            results.append(r)
    return results


async def run(args: argparse.Namespace, trees: list[Path]) -> list[dict[str, Any]]:
    fleet = Fleet(args.workers)
    await fleet.start()
    results = []
    try:
        await fleet.prefill(args.sessions)
        with services(trees, fleet.publishers()) as running:
            built = time.monotonic()
            async with asyncio.timeout(BUILD_SECONDS):
                for service in running:
                    entries = args.sessions * BLOCKS_PER_SESSION
                    await until_built(f"http://127.0.0.1:{service.port}", entries, args.workers)
            print(f"indexes built by replay in {time.monotonic() - built:.1f} s", flush=True)
            results += await phase(args, "idle", running, args.workers)
            if args.ingest_rate:
                ingest = asyncio.create_task(fleet.steady(args.ingest_rate))
                try:
                    await asyncio.sleep(args.warmup)
                    results += await phase(args, "ingest", running, args.workers)
                finally:
                    ingest.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await ingest
    finally:
        await fleet.close()
    return results


def medians(results: list[dict[str, Any]], trees: list[Path], kinds: list[str]) -> None:
    """The table of bench/README.md: median µs per request over runs, per ingest, kind, tree."""
    names = [t.name for t in trees]
    print("\nmedian µs of service CPU per request (ingest idle / ingest running):")
    print("| kind | " + " | ".join(names) + (" | ratio |" if len(names) == 2 else " |"))
    print("|---|" + "---:|" * (len(names) + (len(names) == 2)))
    for kind in kinds:
        cells = []
        figures: dict[str, list[float]] = {}
        for name in names:
            per = []
            for ingest in ("idle", "ingest"):
                values = [
                    r["us"]
                    for r in results
                    if r["tree"] == name and r["kind"] == kind and r["ingest"] == ingest
                ]
                if values:
                    per.append(statistics.median(values))
            figures[name] = per
            cells.append(" / ".join(f"{v:,.0f}" for v in per))
        if len(names) == 2:
            a, b = figures[names[0]], figures[names[1]]
            cells.append(" / ".join(f"{y / x:.2f}" for x, y in zip(a, b, strict=True)))
        print(f"| {kind} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--trees", default=str(REPO), help="comma-separated source trees, one service each"
    )
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--requests", type=int, default=3000, help="per measurement")
    parser.add_argument("--rps", type=float, default=300)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle", type=float, default=2, help="seconds of the idle rate")
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument(
        "--ingest-rate", type=float, default=50_000, help="block-events/s; 0: idle only"
    )
    parser.add_argument("--warmup", type=float, default=5, help="seconds of ingest before")
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    configure_logging("warning", "console")
    results = asyncio.run(run(args, trees))
    medians(results, trees, args.kinds.split(","))


if __name__ == "__main__":
    main()
