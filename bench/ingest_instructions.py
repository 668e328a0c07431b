"""Instructions per block-event of the stream's per-message path, counted by callgrind.

Every timed bench here moves with the shared VM's speed (up to 70% within minutes); an
instruction count does not: the same code, inputs and environment give the same count
whatever else the machine runs. This counts the whole in-process path of
`stream_ingest.py` (a PUB per pod over `inproc://`, each pod's `WorkerStream` with its
receiver, inbox and applier, one `MemoryStore` behind a `StoreGate`) for A/B of hot-path
changes, on source trees side by side:

    .venv/bin/python bench/ingest_instructions.py [--trees A,B] [--workload small,agentic]
        [--pace alone,burst] [--batches 500] [--pods 4] [--seed 7]

Per tree, workload and pace, one child process runs under `valgrind --tool=callgrind`
(`PYTHONHASHSEED=0`, `cwd` and `PYTHONPATH` the tree) and counts only the measured phase:
callgrind zeroes its counters when the child calls `getpgrp()` (after start-up, the
payloads loaded and every subscription connected) and dumps them when it calls
`getppid()` (every batch applied). Paces: `alone` sends one message per pod and waits
(yielding to the loop, no timer) until each is applied, so every message takes a wake-up of
its own, as a fleet's publishers at agentic rates do (route_latency.py's shape); `burst`
sends every message first, as `stream_ingest.py` does (a backlog: drains of up to 512).
`apply` (not in the default) counts the decode and apply alone, `ingest_memory.py`'s loop
without the stream; `--batches 4000` takes the `small` shape past its first evictions.
The payloads (`ingest_memory.py`'s) are built here and handed to the child in a file.
About a minute per child.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pickle
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _decode_and_apply(workload: list[list[bytes]]) -> None:
    """`ingest_memory.py`'s loop, no stream: each pod's batches read by the ingest decoder
    and applied to one memory store (its first batch before the count, as in the stream)."""
    from kvsi.store.memory import MemoryStore
    from kvsi.store.model import Batch, WorkerKey
    from kvsi.subscriber.decode import ingest_decoder

    decoder = ingest_decoder()
    store = MemoryStore()
    keys = [WorkerKey(f"pod-{pod}", 0) for pod in range(len(workload))]

    def apply(key: WorkerKey, seq: int, payload: bytes) -> None:
        decoded = decoder.decode(payload)
        store.apply_now(key, Batch(seq, decoded.ts, decoded.events))

    for key, payloads in zip(keys, workload, strict=True):
        apply(key, 0, payloads[0])
    os.getpgrp()  # callgrind: --zero-before=getpgrp
    for key, payloads in zip(keys, workload, strict=True):
        for seq in range(1, len(payloads)):
            apply(key, seq, payloads[seq])
    os.getppid()  # callgrind: --dump-before=getppid


def _child(args: argparse.Namespace) -> None:
    if args.pace == "apply":
        _decode_and_apply(pickle.loads(Path(args.child).read_bytes()))
        return
    import structlog
    import zmq
    import zmq.asyncio
    from stream_ingest import close_all

    from kvsi.store.memory import MemoryStore
    from kvsi.store.model import WorkerKey
    from kvsi.subscriber.gate import StoreGate
    from kvsi.subscriber.stream import IngestOptions, PublisherSpec, WorkerStream

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    workload: list[list[bytes]] = pickle.loads(Path(args.child).read_bytes())

    more = int(zmq.SNDMORE)

    def send(pub: zmq.Socket[bytes], seq: int, payload: bytes) -> None:
        """vLLM's live frames on a plain PUB (no high-water mark: never blocks), as cheaply
        as pyzmq sends them: the publishers' own cost is counted with the stream's."""
        pub.send(b"kv@bench@model", more)
        pub.send(seq.to_bytes(8, "big"), more)
        pub.send(payload)

    async def run() -> None:
        ctx = zmq.asyncio.Context()
        plain = zmq.Context.shadow(ctx.underlying)  # the publishers' plain sockets, same context
        store = MemoryStore()
        gate = StoreGate(store)
        options = IngestOptions(queue_size=len(workload[0]) + 10, index_audit=3600.0)
        keys = [WorkerKey(f"pod-{pod}", 0) for pod in range(len(workload))]
        pubs, tasks = [], []
        for pod, _ in enumerate(workload):
            pub: zmq.Socket[bytes] = plain.socket(zmq.PUB)
            pub.setsockopt(zmq.SNDHWM, 0)
            pub.bind(f"inproc://bench-{pod}")
            pubs.append(pub)
            spec = PublisherSpec(f"pod-{pod}", f"inproc://bench-{pod}")
            tasks.append(asyncio.create_task(WorkerStream(spec, gate, ctx, options=options).run()))
        for key, pub, payloads in zip(keys, pubs, workload, strict=True):
            while await store.fence(key) is None:  # connected: a PUB drops before
                send(pub, 0, payloads[0])
                await asyncio.sleep(0.01)

        async def applied(seq: int) -> None:
            while True:
                fences = [await store.fence(key) for key in keys]
                if all(f is not None and f.seq >= seq for f in fences):
                    return
                await asyncio.sleep(0)

        last = len(workload[0]) - 1
        os.getpgrp()  # callgrind: --zero-before=getpgrp
        for seq in range(1, last + 1):
            for pub, payloads in zip(pubs, workload, strict=True):
                send(pub, seq, payloads[seq])
            if args.pace == "alone":
                await applied(seq)
        await applied(last)
        os.getppid()  # callgrind: --dump-before=getppid
        await close_all(tasks, pubs, ctx)

    asyncio.run(run())


def _count(tree: Path, data: Path, pace: str, out: Path) -> int:
    """Instructions of one child's measured phase."""
    command = [
        "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
        "--zero-before=getpgrp", "--dump-before=getppid",
        sys.executable, str(HERE / "ingest_instructions.py"), "--child", str(data), "--pace", pace,
    ]  # fmt: skip
    env = os.environ | {"PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    subprocess.run(command, cwd=tree, env=env, check=True, capture_output=True)
    part = Path(f"{out}.1").read_text()
    found = re.search(r"^summary: (\d+)$", part, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no summary in {out}.1")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", default=str(HERE.parent), help="comma-separated source trees")
    parser.add_argument("--workload", default="small,agentic")
    parser.add_argument("--pace", default="alone,burst")
    parser.add_argument("--batches", type=int, default=500)
    parser.add_argument("--pods", type=int, default=4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    sys.path.insert(0, str(HERE))
    from ingest_memory import agentic, small_events
    from stream_ingest import block_events

    makers = {"small": small_events, "agentic": agentic}
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    print(f"trees: {', '.join(f'{i}={t}' for i, t in enumerate(trees))}")
    print(f"{'workload':<9} {'pace':<6} {'tree':>4} {'instructions':>15} {'/block-event':>13}"
          f" {'/batch':>9} {'vs tree 0':>9}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="kvsi-instr-") as tmp:
        for name in args.workload.split(","):
            workload = [makers[name](args.batches, args.seed + pod) for pod in range(args.pods)]
            events = sum(block_events(payloads[1:]) for payloads in workload)
            batches = (args.batches - 1) * args.pods
            data = Path(tmp) / f"{name}.pickle"
            data.write_bytes(pickle.dumps(workload))
            for pace in args.pace.split(","):
                first = 0
                for i, tree in enumerate(trees):
                    n = _count(tree, data, pace, Path(tmp) / f"cg-{name}-{pace}-{i}.out")
                    first = first or n
                    print(
                        f"{name:<9} {pace:<6} {i:>4} {n:>15,} {n / events:>13,.0f}"
                        f" {n / batches:>9,.0f} {n / first:>9.3f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
