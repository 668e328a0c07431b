"""`kvsi`: serve, simulate and tail, on top of the one settings object.

Imports every part lazily per command, so `kvsi tail` does not start a web stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Annotated, Any

import typer

from kvsi.logs import configure_logging
from kvsi.settings import load_settings

app = typer.Typer(
    help="Per-session index of vLLM KV-cache blocks.",
    no_args_is_help=True,
    # Help texts are plain: NAME[/RANK] is an option's syntax, not rich markup.
    rich_markup_mode=None,
)


def parse_pods(pods: list[str], replays: list[str]) -> list[dict[str, Any]]:
    """`NAME[/RANK]=ENDPOINT` flags (and `NAME[/RANK]=REPLAY`) as publisher configs."""
    out: dict[str, dict[str, Any]] = {}
    for flag in pods:
        name, endpoint = _split(flag, "--pod")
        pod, _, rank = name.partition("/")
        out[name] = {"pod": pod, "endpoint": endpoint, "dp_rank": int(rank or 0)}
    for flag in replays:
        name, endpoint = _split(flag, "--replay")
        if name not in out:
            raise typer.BadParameter(f"--replay {flag!r}: no --pod named {name!r}")
        out[name]["replay_endpoint"] = endpoint
    return list(out.values())


def stop_on_sigterm() -> None:
    """SIGTERM (docker stop, the kubelet) stops like Ctrl-C: streams, store and HTTP close
    in order and the exit code is 0, instead of the process dying mid-write."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def parse_labels(flags: list[str]) -> dict[str, str]:
    """`KEY=VALUE` label flags as a selector (every pair must match)."""
    labels: dict[str, str] = {}
    for flag in flags:
        key, sep, value = flag.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--discover {flag!r}: expected KEY=VALUE")
        labels[key] = value
    return labels


def _split(flag: str, option: str) -> tuple[str, str]:
    name, sep, endpoint = flag.partition("=")
    if not sep or not name or not endpoint:
        raise typer.BadParameter(f"{option} {flag!r}: expected NAME=ENDPOINT")
    pod, _, rank = name.partition("/")
    if not pod or (rank and not rank.isdigit()):
        raise typer.BadParameter(f"{option} {flag!r}: NAME is POD or POD/RANK")
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
    overrides: dict[str, Any] = {
        k: v
        for k, v in {
            "topic": topic,
            "store": store,
            "host": host,
            "port": port,
            "api": api,
            "ingest": ingest,
            "metrics_port": metrics_port,
        }.items()
        if v is not None
    }
    if pod:
        overrides["publishers"] = parse_pods(pod, replay or [])
    if discover:
        overrides["discovery"] = {"labels": parse_labels(discover)}
    if namespace is not None:
        overrides.setdefault("discovery", {})["namespace"] = namespace
    if demo:
        overrides["demo"] = True
    settings = load_settings(config, **overrides)
    configure_logging(settings.log_level, settings.log_format)
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

    stop_on_sigterm()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_service(settings, on_ready=announce))


@app.command()
def simulate(
    pods: Annotated[int, typer.Option(help="Simulated pods.")] = 3,
    base_port: Annotated[int, typer.Option(help="PUB port of the first pod.")] = 5557,
    rate: Annotated[float, typer.Option(help="Batches per second per pod.")] = 20.0,
    sessions: Annotated[int, typer.Option(help="Concurrent sessions per pod.")] = 50,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    host: Annotated[
        str, typer.Option(help="Address the pods bind (0.0.0.0 to be reached from elsewhere).")
    ] = "127.0.0.1",
    duration: Annotated[
        float | None, typer.Option(help="Seconds to run (default: until Ctrl-C).")
    ] = None,
) -> None:
    """Publish vLLM 0.33 KV events from simulated pods (no GPU needed)."""
    configure_logging("info", "console")
    from simulator.fleet import simulate as run_fleet

    stop_on_sigterm()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(
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


@app.command()
def tail(
    endpoint: Annotated[str, typer.Argument(help="Publisher endpoint, e.g. tcp://host:5557.")],
    topic: Annotated[str, typer.Option(help="Topic prefix filter.")] = "",
    count: Annotated[int | None, typer.Option(help="Stop after this many messages.")] = None,
) -> None:
    """Print a publisher's decoded events, one line each."""
    from kvsi.tail import tail as run_tail

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_tail(endpoint, topic, count))
