"""What does the app itself cost per request, without the HTTP server?

Run: `.venv/bin/python bench/api_asgi.py [--trees A,B] [--rounds 5] [--requests 1000]` (see
bench/README.md). In this process, no socket: for each source tree of `--trees` (default
this checkout) a child process imports that tree's `kvsi`, fills a memory store (100 live
workers, 5,000 sessions of a 10-block chain), builds the app with `create_app` and calls it
as ASGI with the same requests bench/api_cpu.py sends (route, session view, hint, healthz),
timing CPU (`time.process_time`) over `--requests` requests per kind and round. Request
logs are written as the service writes them (console format, to /dev/null); metrics count.
The trees run in turn, `--alternations` times. Prints the minimum and median µs per request
of each kind and tree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from processes import REPO

CHILD = """
import asyncio, json, random, statistics, sys, time
from kvsi.api.app import create_app
from kvsi.logs import configure_logging
from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, EntriesStored, WorkerKey, WorkerState, WorkerStatus

WORKERS, SESSIONS = 100, 5000
rounds, count, kinds = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",")


def scope(method, path, headers):
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "headers": [(b"host", b"x"), *headers],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "state": {}}


async def main():
    configure_logging("info", "console")
    store = MemoryStore()
    for w in range(WORKERS):
        await store.set_status(WorkerKey(f"vllm-{w}", 0), WorkerStatus(WorkerState.LIVE, 1.0))
    rng = random.Random(1)
    chains = {}
    for s in range(SESSIONS):
        chains[s] = [rng.getrandbits(64) for _ in range(10)]
        event = EntriesStored(chains[s], "GPU", 0, f"sess-{s}", block_size=16)
        await store.apply(WorkerKey(f"vllm-{s % WORKERS}", 0), Batch(s // WORKERS, 1.0, [event]))
    app = create_app(store)
    answers = []

    async def send(message):
        answers.append(message)

    def request(kind, s):
        if kind == "route":
            hashes = [str(h) for h in chains[s]] + ["1", "2"]
            body = json.dumps({"session_id": f"sess-{s}", "block_hashes": hashes}).encode()
            head = [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())]
            return scope("POST", "/v1/route", head), body
        path = {"session": f"/v1/sessions/sess-{s}", "hint": f"/v1/sessions/sess-{s}/hint",
                "healthz": "/healthz"}[kind]
        return scope("GET", path, []), b""

    out = {}
    for kind in kinds:
        times = []
        for _ in range(rounds):
            batch = [request(kind, rng.randrange(SESSIONS)) for _ in range(count)]
            started = time.process_time()
            for sc, body in batch:
                pending = [{"type": "http.request", "body": body, "more_body": False}]

                async def receive():
                    return pending.pop() if pending else {"type": "http.disconnect"}

                await app(sc, receive, send)
            times.append((time.process_time() - started) / count * 1e6)
            statuses = {m["status"] for m in answers if m["type"] == "http.response.start"}
            assert statuses == {200}, statuses
            answers.clear()
        out[kind] = {"min": min(times), "median": statistics.median(times)}
    print(json.dumps(out), file=sys.__stdout__, flush=True)


asyncio.run(main())
"""


def measure(tree: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """One child process importing `tree`'s kvsi: µs per request by kind."""
    with open(os.devnull, "w") as logs:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, str(args.rounds), str(args.requests), args.kinds],
            env=os.environ | {"PYTHONPATH": str(tree)},
            cwd=tree, stdout=subprocess.PIPE, stderr=logs, check=True,
        ).stdout  # fmt: skip
    result: dict[str, dict[str, float]] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trees", default=str(REPO), help="comma-separated source trees")
    parser.add_argument("--kinds", default="route,session,hint,healthz")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per kind")
    parser.add_argument("--requests", type=int, default=1000, help="per round")
    parser.add_argument("--alternations", type=int, default=2, help="times each tree runs")
    args = parser.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    best: dict[tuple[str, str], list[float]] = {}
    for n in range(args.alternations):
        for tree in trees if n % 2 == 0 else trees[::-1]:
            for kind, figures in measure(tree, args).items():
                print(
                    f"{tree.name:>12} {kind:>8}: min {figures['min']:6.0f} µs, "
                    f"median {figures['median']:6.0f} µs  load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
                best.setdefault((tree.name, kind), []).append(figures["min"])
    print("\nlowest µs per request over every round and alternation:")
    print("| kind | " + " | ".join(t.name for t in trees) + " |")
    print("|---|" + "---:|" * len(trees))
    for kind in args.kinds.split(","):
        cells = [f"{min(best[t.name, kind]):,.0f}" for t in trees]
        print(f"| {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
