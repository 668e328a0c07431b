"""`kvsi`: serve, simulate and tail, on top of the one settings object.

Imports every part lazily per command, so `kvsi tail` does not start a web stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Annotated, Any

import structlog
import typer

from kvsi import tracing
from kvsi.errors import StartupError
from kvsi.logs import configure_logging
from kvsi.loops import LoopFactory, loop_factory, share_the_interpreter
from kvsi.settings import load_settings, unknown_variables
from kvsi.version import core_build, package_version

app = typer.Typer(
    help="Per-session index of vLLM KV-cache blocks.",
    no_args_is_help=True,
    # Help texts are plain: NAME[/RANK] is an option's syntax, not rich markup.
    rich_markup_mode=None,
)


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"kvsi {package_version()} ({core_build()} core)")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the version (the image's tag) and exit.",
        ),
    ] = False,
) -> None:
    """Per-session index of vLLM KV-cache blocks."""


def parse_pods(pods: list[str], replays: list[str]) -> list[dict[str, Any]]:
    """`NAME[/RANK]=ENDPOINT` flags (and `NAME[/RANK]=REPLAY`) as publisher configs; a name
    given twice, or a replay for no pod, is a StartupError (never silently dropped)."""
    out: dict[str, dict[str, Any]] = {}
    for flag in pods:
        name, endpoint = _split(flag, "--pod")
        if name in out:
            raise StartupError(f"--pod {flag!r}: {name!r} is named by another --pod already")
        pod, _, rank = name.partition("/")
        out[name] = {"pod": pod, "endpoint": endpoint, "dp_rank": int(rank or 0)}
    for flag in replays:
        name, endpoint = _split(flag, "--replay")
        if name not in out:
            raise StartupError(f"--replay {flag!r}: no --pod named {name!r}")
        if "replay_endpoint" in out[name]:
            raise StartupError(f"--replay {flag!r}: {name!r} has a --replay already")
        out[name]["replay_endpoint"] = endpoint
    return list(out.values())


def run_until_signalled(
    main: Coroutine[Any, Any, None], loop_factory: LoopFactory | None = None
) -> None:
    """Run `main` until it returns or SIGINT / SIGTERM (Ctrl-C, docker stop, the kubelet)
    arrives, on a loop from `loop_factory` (None: asyncio's). The first signal cancels it
    inside the event loop, so streams, store and HTTP close in order, every worker thread is
    let go and the exit code is 0, instead of a KeyboardInterrupt landing wherever the loop
    happens to be. A second signal during that shutdown cancels again, cutting the cleanup
    short (an operator's second Ctrl-C)."""

    stops = {signal.SIGINT, signal.SIGTERM}

    async def until_signalled() -> None:
        loop = asyncio.get_running_loop()
        task = loop.create_task(main, name="main")
        for signum in stops:
            loop.add_signal_handler(signum, task.cancel)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)  # one held meanwhile cancels now
        with contextlib.suppress(asyncio.CancelledError):
            await task

    # Held while the event loop is made: a stop raised inside its constructor leaves a
    # half-made loop whose finalizer prints a traceback. Blocking them also runs the handler
    # of a SIGTERM that came during start-up, if it has not run yet.
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    # Put back when the loop is gone: uvloop's leaves its own handlers, which do nothing
    # once it is closed (a stop during the exit's cleanup, e.g. flushing spans, was lost).
    handlers = {signum: signal.getsignal(signum) for signum in stops}
    try:
        if _STOP_WHILE_STARTING.noted:
            main.close()
            return
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            runner.run(until_signalled())
    finally:
        for signum, handler in handlers.items():
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)


class StopWhileStarting:
    """Notes a SIGTERM that comes while the command still imports and configures; the
    command then ends, exit 0, where it would have started running. Raising from the handler
    instead (SystemExit) lands inside whatever runs at that moment, and C code that calls
    back into Python can replace it with an error of its own: CPython's import machinery
    turned it into "TypeError: expected a message argument" and exit code 1."""

    def __init__(self) -> None:
        self.noted = False

    def __call__(self, signum: int, _frame: object) -> None:
        self.noted = True


_STOP_WHILE_STARTING = StopWhileStarting()


@contextlib.contextmanager
def startup_errors() -> Iterator[None]:
    """A StartupError is one line on stderr and exit code 2, without a traceback. A SIGTERM
    while the command still imports and configures (over a second on a busy node) is a
    clean exit 0 once that is done: nothing has started that needs stopping."""
    _STOP_WHILE_STARTING.noted = False
    before = signal.signal(signal.SIGTERM, _STOP_WHILE_STARTING)
    try:
        yield
    except StartupError as exc:
        typer.echo(f"kvsi: error: {exc}", err=True)
        raise typer.Exit(2) from None
    finally:
        signal.signal(signal.SIGTERM, before)


def parse_labels(flags: list[str]) -> dict[str, str]:
    """`KEY=VALUE` label flags as a selector (every pair must match)."""
    labels: dict[str, str] = {}
    for flag in flags:
        key, sep, value = flag.partition("=")
        if not sep or not key:
            raise StartupError(f"--discover {flag!r}: expected KEY=VALUE")
        labels[key] = value
    return labels


def _split(flag: str, option: str) -> tuple[str, str]:
    name, sep, endpoint = flag.partition("=")
    if not sep or not name or not endpoint:
        raise StartupError(f"{option} {flag!r}: expected NAME=ENDPOINT")
    pod, _, rank = name.partition("/")
    if not pod or (rank and not rank.isdigit()):
        raise StartupError(f"{option} {flag!r}: NAME is POD or POD/RANK")
    return name, endpoint


@app.command()
def serve(
    pod: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME[/RANK]=ENDPOINT", help="Publisher as NAME[/RANK]=ENDPOINT (repeatable)."
        ),
    ] = None,
    replay: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME[/RANK]=ENDPOINT",
            help="Replay endpoint as NAME[/RANK]=ENDPOINT (repeatable).",
        ),
    ] = None,
    topic: Annotated[str | None, typer.Option(help="ZMQ topic prefix filter.")] = None,
    store: Annotated[str | None, typer.Option(help="memory, or a Redis URL.")] = None,
    host: Annotated[str | None, typer.Option(help="HTTP bind address.")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port.")] = None,
    api: Annotated[bool | None, typer.Option("--api/--no-api", help="Serve the HTTP API.")] = None,
    ingest: Annotated[
        bool | None, typer.Option("--ingest/--no-ingest", help="Subscribe to publishers.")
    ] = None,
    discover: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY=VALUE",
            help="Central mode: subscribe to the Kubernetes pods with this label, as "
            "KEY=VALUE (repeatable; every one must match). Needs the k8s extra.",
        ),
    ] = None,
    namespace: Annotated[
        str | None, typer.Option(help="Namespace --discover watches (default: the client's).")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(help="With --no-api: serve /healthz, /readyz and /metrics on this port."),
    ] = None,
    demo: Annotated[
        bool, typer.Option(help="Also run a simulated fleet of vLLM pods in-process.")
    ] = False,
    config: Annotated[Path | None, typer.Option(help="TOML config file.")] = None,
) -> None:
    """Ingest KV events and serve the index (the API and ingest in one process)."""
    with startup_errors():
        settings = load_settings(
            config,
            **serve_overrides(
                pod=pod or [],
                replay=replay or [],
                discover=discover or [],
                namespace=namespace,
                demo=demo,
                flags={
                    "topic": topic,
                    "store": store,
                    "host": host,
                    "port": port,
                    "api": api,
                    "ingest": ingest,
                    "metrics_port": metrics_port,
                },
            ),
        )
        configure_logging(settings.log_level, settings.log_format)
        warn_unknown_variables()
        factory = loop_factory(settings.event_loop)
        share_the_interpreter()
        tracing.configure()  # before the apps are built: they add a span middleware if on
        from kvsi.serve import run_service

        def announce(url: str) -> None:
            if url:
                typer.echo(f"kv-session-index is serving on {url}")
                typer.echo(f"  dashboard: {url}/")
                typer.echo(f"  fleet:     {url}/v1/pods")
                typer.echo(f"  sessions:  {url}/v1/sessions")
                typer.echo(f"  one:       {url}/v1/sessions/<session_id>")
                typer.echo(f"  API docs:  {url}/docs")
                typer.echo(f"  metrics:   {url}/metrics")

        try:
            run_until_signalled(run_service(settings, on_ready=announce), factory)
        finally:
            tracing.shutdown()  # export the spans still buffered


def warn_unknown_variables() -> None:
    """One warning line naming the `KVSI_*` variables that set nothing (a typo keeps the
    default in place silently otherwise)."""
    unknown = unknown_variables(os.environ)
    if unknown:
        structlog.get_logger(__name__).warning(
            "settings.unknown_variables",
            ignored=unknown,
            hint="KVSI_ + a setting's name in capitals, nested with __ (README: Configuration)",
        )


def serve_overrides(
    *,
    pod: list[str],
    replay: list[str],
    discover: list[str],
    namespace: str | None,
    demo: bool,
    flags: dict[str, Any],
) -> dict[str, Any]:
    """What `kvsi serve`'s flags set, as settings overrides (flags left out set nothing)."""
    overrides = {k: v for k, v in flags.items() if v is not None}
    if pod or replay:
        overrides["publishers"] = parse_pods(pod, replay)
    if discover:
        overrides["discovery"] = {"labels": parse_labels(discover)}
    if namespace is not None:
        overrides.setdefault("discovery", {})["namespace"] = namespace
    if demo:
        overrides["demo"] = True
    return overrides


@app.command()
def simulate(
    pods: Annotated[int, typer.Option(min=1, max=1024, help="Simulated pods.")] = 3,
    base_port: Annotated[
        int, typer.Option(min=0, max=65535, help="PUB port of the first pod (0: free ports).")
    ] = 5557,
    rate: Annotated[
        float, typer.Option(min=0, help="Batches per second per pod (0: as fast as it can).")
    ] = 20.0,
    sessions: Annotated[int, typer.Option(min=1, help="Concurrent sessions per pod.")] = 50,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    host: Annotated[
        str, typer.Option(help="Address the pods bind (0.0.0.0 to be reached from elsewhere).")
    ] = "127.0.0.1",
    duration: Annotated[
        float | None, typer.Option(min=0, help="Seconds to run (default: until Ctrl-C).")
    ] = None,
) -> None:
    """Publish vLLM 0.33 KV events from simulated pods (no GPU needed)."""
    with startup_errors():
        configure_logging("info", "console")
        from kvsi.simulator.fleet import FleetBindError
        from kvsi.simulator.fleet import simulate as run_fleet

        if base_port and base_port + 2 * pods - 1 > 65535:
            raise StartupError(
                f"--base-port {base_port}: {pods} pods need ports up to {base_port + 2 * pods - 1}"
            )

        try:
            run_until_signalled(
                run_fleet(
                    pods=pods,
                    base_port=base_port,
                    rate=rate,
                    sessions=sessions,
                    seed=seed,
                    duration=duration,
                    host=host,
                )
            )
        except FleetBindError as exc:
            raise StartupError(str(exc)) from exc


@app.command()
def tail(
    endpoint: Annotated[str, typer.Argument(help="Publisher endpoint, e.g. tcp://host:5557.")],
    topic: Annotated[str, typer.Option(help="Topic prefix filter.")] = "",
    count: Annotated[int | None, typer.Option(min=1, help="Stop after this many messages.")] = None,
    quiet_notice: Annotated[
        float,
        typer.Option(
            min=0.1, help="Say so on stderr after this many seconds with nothing received."
        ),
    ] = 10.0,
) -> None:
    """Print a publisher's decoded events, one line each."""
    from kvsi.tail import tail as run_tail

    with startup_errors():
        run_until_signalled(run_tail(endpoint, topic, count, quiet_notice=quiet_notice))


@app.command()
def size(
    workers: Annotated[int, typer.Option(min=1, help="Workers: pods x data-parallel ranks.")],
    entries: Annotated[
        int, typer.Option(min=1, help="Resident (session, block) entries over the fleet.")
    ],
    sessions: Annotated[
        int | None, typer.Option(min=1, help="Sessions (default: entries / 100).")
    ] = None,
    blocks_per_worker: Annotated[
        int | None,
        typer.Option(min=1, help="Resident blocks per worker (default: entries / workers)."),
    ] = None,
    event_rate: Annotated[
        float | None,
        typer.Option(min=0, help="Block-events/s over the fleet (default: 1,000 per worker)."),
    ] = None,
    query_rate: Annotated[
        float | None,
        typer.Option(min=0, help="Routes/s over the fleet (default: 10 per worker)."),
    ] = None,
    batch_events: Annotated[
        float | None,
        typer.Option(
            min=1, help="Block-events per published batch (default: the agentic workload's)."
        ),
    ] = None,
    reannounced: Annotated[
        float | None,
        typer.Option(
            min=0,
            max=1,
            help="Share of block-events re-announcing an entry a session holds, 0 to 1 "
            "(default: the agentic workload's).",
        ),
    ] = None,
    shards: Annotated[
        int | None, typer.Option(min=1, help="Redis shards to plan for (default: as needed).")
    ] = None,
    cpu_share: Annotated[
        float, typer.Option(min=0.01, max=1, help="Share of a core planned per shard, process.")
    ] = 0.5,
    shard_memory_gib: Annotated[
        float, typer.Option(min=0.01, help="Memory of one Redis shard, GiB.")
    ] = 25.0,
    process_memory_gib: Annotated[
        float, typer.Option(min=0.01, help="Memory of one kvsi process, GiB.")
    ] = 16.0,
) -> None:
    """Plan Redis shards and processes for a fleet, from the measured costs (deploy/SIZING.md)."""
    from kvsi.sizing import CLUSTER_MIN_MASTERS, Budget, describe, plan, render

    with startup_errors():
        numbers = {
            "--event-rate": event_rate,
            "--query-rate": query_rate,
            "--batch-events": batch_events,
            "--shard-memory-gib": shard_memory_gib,
            "--process-memory-gib": process_memory_gib,
        }
        for flag, number in numbers.items():
            if number is not None and not math.isfinite(number):
                raise StartupError(f"{flag} {number}: must be a finite number")
        if shards is not None and 1 < shards < CLUSTER_MIN_MASTERS:
            raise StartupError(
                f"--shards {shards}: a Redis Cluster has at least {CLUSTER_MIN_MASTERS} "
                "masters (1 is one Redis)"
            )
        fleet = describe(
            workers,
            entries,
            sessions,
            blocks_per_worker,
            event_rate,
            query_rate,
            batch_events,
            reannounced,
        )
        budget = Budget(
            cpu_share=cpu_share,
            shard_memory_gib=shard_memory_gib,
            process_memory_gib=process_memory_gib,
        )
        typer.echo(render(plan(fleet, budget, shards=shards)))
