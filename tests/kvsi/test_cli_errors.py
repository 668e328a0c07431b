"""Every mistake a user makes starting `kvsi` is one line on stderr and exit code 2: a real
process per case, as a shell or a container runtime sees it."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from kvsi.tail import tail
from tests.e2e.services import services
from tests.environ import service_environ
from tests.ports import free_port_run, refusing_port
from tests.waiting import eventually

pytestmark = pytest.mark.e2e

KVSI = [sys.executable, "-m", "kvsi"]

WITHOUT_REDIS_CLIENT = [
    sys.executable,
    "-c",
    "import sys; sys.modules['redis'] = None; from kvsi.cli import app; app()",
]
"""`kvsi` in an environment where `import redis` fails (an install without the client)."""


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env=service_environ({"COLUMNS": "200"} | (env or {})),
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def bad_toml(tmp: Path) -> str:
    path = tmp / "bad.toml"
    path.write_text("port = [\n")
    return str(path)


CASES: list[tuple[str, list[str], dict[str, str], str]] = [
    # (id, argv after `kvsi`, environment, what the one line must say)
    ("tokens-not-json", ["serve"], {"KVSI_API_TOKENS": "plain"}, "KVSI_API_TOKENS is not valid"),
    ("config-not-a-file", ["serve", "--config", "/dev/null"], {}, "config file /dev/null is not"),
    (
        "tokens-file-missing",
        ["serve"],
        {"KVSI_API_TOKENS_FILE": "/nonexistent"},
        "setting api_tokens_file: Path does not point to a file (got '/nonexistent')",
    ),
    ("store-unknown", ["serve", "--store", "bogus://x"], {}, "unknown store 'bogus://x'; valid:"),
    (
        "store-bad-option-password-masked",
        ["serve", "--store", "redis://:hunter2@127.0.0.1:1/?registry_ttl=x"],
        {},
        "redis://:***@127.0.0.1:1/?registry_ttl=x': registry_ttl must be a number",
    ),
    (
        "store-bad-option-query-password-masked",
        ["serve", "--store", "redis://127.0.0.1:1/?password=hunter2&registry_ttl=x"],
        {},
        "redis://127.0.0.1:1/?password=***&registry_ttl=x': registry_ttl must be a number",
    ),
    (
        "store-cluster-calls-not-a-number",
        ["serve", "--store", "redis+cluster://127.0.0.1:1/?max_connections=lots"],
        {},
        "?max_connections=lots': max_connections must be an integer of at least 2",
    ),
    (
        "store-pool-of-one",
        ["serve", "--store", "redis://127.0.0.1:1/?max_connections=1"],
        {},
        "?max_connections=1': max_connections must be an integer of at least 2",
    ),
    (
        "pod-not-a-url",
        ["serve", "--pod", "a=notaurl"],
        {},
        "setting publishers.0.endpoint: endpoint 'notaurl' must start with tcp://",
    ),
    ("pod-no-endpoint", ["serve", "--pod", "a"], {}, "--pod 'a': expected NAME=ENDPOINT"),
    (
        "idle-past-the-session-directory",
        ["serve", "--store", "redis://127.0.0.1:1/0"],
        {"KVSI_SESSION_IDLE_SECONDS": "90000"},
        "session_idle_seconds: at most 86400 on Redis",
    ),
    (
        "pod-twice",
        ["serve", "--pod", "a=tcp://127.0.0.1:1", "--pod", "a=tcp://127.0.0.1:2"],
        {},
        "'a' is named by another --pod already",
    ),
    (
        "replay-without-pod",
        ["serve", "--replay", "b=tcp://127.0.0.1:2"],
        {},
        "--replay 'b=tcp://127.0.0.1:2': no --pod named 'b'",
    ),
    (
        "replay-other-pod",
        ["serve", "--pod", "a=tcp://127.0.0.1:1", "--replay", "b=tcp://127.0.0.1:2"],
        {},
        "no --pod named 'b'",
    ),
    ("port-out-of-range", ["serve", "--port", "99999"], {}, "setting port: Input should be less"),
    ("discover-no-value", ["serve", "--discover", "app"], {}, "expected KEY=VALUE"),
    ("config-missing", ["serve", "--config", "/nonexistent.toml"], {}, "does not exist"),
    (
        "pattern-in-words",
        ["serve"],
        {"KVSI_DYNAMO__PREFIX": "dyn"},
        "setting dynamo.prefix: must be a URL path such as /dynamo (got 'dyn')",
    ),
    ("store-memory-url", ["serve", "--store", "memory://x"], {}, "unknown store 'memory://x'"),
    (
        "store-bad-port-named",
        ["serve", "--store", "redis://:pw@127.0.0.1:notaport"],
        {},
        "store 'redis://:***@127.0.0.1:notaport': Port could not be cast",
    ),
    ("config-a-directory", ["serve", "--config", "/"], {}, "config file / is not a file"),
    (
        "config-unknown-key-nested",
        ["serve"],
        {"KVSI_PUBLISHERS": '[{"pod": "a", "endpoint": "tcp://127.0.0.1:1", "replay": "x"}]'},
        "setting publishers.0.replay: unknown; valid here: dp_rank, endpoint, model, pod, "
        "replay_endpoint, topic",
    ),
    (
        "nested-variable-not-json",
        ["serve"],
        {"KVSI_DISCOVERY__LABELS": "bad"},
        "environment variable KVSI_DISCOVERY__LABELS is not valid JSON",
    ),
    ("tail-not-a-url", ["tail", "notaurl"], {}, "endpoint 'notaurl' must start with tcp://"),
    (
        "size-two-shards",
        ["size", "--workers", "10", "--entries", "1000", "--shards", "2"],
        {},
        "--shards 2: a Redis Cluster has at least 3 masters (1 is one Redis)",
    ),
    (
        "size-infinite-rate",
        ["size", "--workers", "10", "--entries", "1000", "--event-rate", "inf"],
        {},
        "--event-rate inf: must be a finite number",
    ),
    (
        "discover-outside-a-cluster",
        ["serve", "--discover", "app=vllm"],
        {"KUBECONFIG": "/nonexistent/kubeconfig"},
        "--discover needs a Kubernetes configuration",
    ),
    (
        "discover-split-on-memory",
        ["serve", "--discover", "app=vllm"],
        {"KVSI_DISCOVERY__SPLIT": "true"},
        "discovery.split needs a shared store (redis://...)",
    ),
]


@pytest.mark.parametrize(("argv", "env", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_mistake_is_one_line_and_exit_code_2(
    argv: list[str], env: dict[str, str], says: str
) -> None:
    if argv[0] == "serve" and "--port" not in argv:
        argv = [*argv, "--port", "0"]  # a case that regressed into serving binds no fixed port
    assert_one_line(run([*KVSI, *argv], env), says)


USAGE: list[tuple[str, list[str], str]] = [
    # Typer's own checks of option values: one line naming the option, exit code 2.
    ("simulate-no-pods", ["simulate", "--pods", "0"], "Invalid value for '--pods'"),
    ("simulate-no-sessions", ["simulate", "--sessions", "0"], "Invalid value for '--sessions'"),
    ("simulate-port-range", ["simulate", "--base-port", "99999"], "'--base-port'"),
    ("simulate-negative-rate", ["simulate", "--rate", "-1"], "Invalid value for '--rate'"),
    ("tail-quiet-zero", ["tail", "tcp://127.0.0.1:1", "--quiet-notice", "0"], "--quiet-notice"),
    ("tail-count-negative", ["tail", "tcp://127.0.0.1:1", "--count", "-1"], "'--count'"),
    ("size-no-workers", ["size", "--workers", "0", "--entries", "1"], "'--workers'"),
    ("size-no-entries", ["size", "--workers", "1"], "Missing option '--entries'"),
    ("size-not-a-number", ["size", "--workers", "1", "--entries", "1e9x"], "'--entries'"),
    (
        "size-negative-rate",
        ["size", "--workers", "1", "--entries", "1", "--event-rate", "-1"],
        "--event-rate",
    ),
    (
        "size-share-past-a-core",
        ["size", "--workers", "1", "--entries", "1", "--cpu-share", "2"],
        "--cpu-share",
    ),
    (
        "size-empty-batches",
        ["size", "--workers", "1", "--entries", "1", "--batch-events", "0"],
        "--batch-events",
    ),
    (
        "size-reannounced-past-all",
        ["size", "--workers", "1", "--entries", "1", "--reannounced", "1.5"],
        "--reannounced",
    ),
]


@pytest.mark.parametrize(("argv", "says"), [c[1:] for c in USAGE], ids=[c[0] for c in USAGE])
def test_an_option_out_of_range_is_a_usage_error(argv: list[str], says: str) -> None:
    result = run([*KVSI, *argv])
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and says in result.stderr, result.stderr


def test_simulated_pods_past_the_last_port_are_one_line() -> None:
    result = run([*KVSI, "simulate", "--base-port", "65534", "--duration", "1"])
    assert_one_line(result, "--base-port 65534: 3 pods need ports up to 65539")


@pytest.mark.parametrize("command", ["simulate", "demo"])
def test_simulated_pods_on_a_port_in_use_are_one_line(command: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        if command == "simulate":
            result = run([*KVSI, "simulate", "--base-port", str(port), "--duration", "1"])
        else:
            env = {"KVSI_DEMO_BASE_PORT": str(port)}
            result = run([*KVSI, "serve", "--demo", "--port", "0"], env)
    assert_one_line(result, f"cannot bind tcp://127.0.0.1:{port}")


def test_bad_toml_is_one_line(tmp_path: Path) -> None:
    assert_one_line(
        run([*KVSI, "serve", "--config", bad_toml(tmp_path)]), "is not valid TOML: Invalid value"
    )


def test_an_unknown_name_in_the_config_file_lists_the_valid_ones(tmp_path: Path) -> None:
    config = tmp_path / "kvsi.toml"
    config.write_text('prot = 8000\n[dynamo]\nprefixx = "/x"\n')
    result = run([*KVSI, "serve", "--config", str(config)])
    assert_one_line(result, "setting prot: unknown; valid here: access_log, api, api_require")
    assert "setting dynamo.prefixx: unknown; valid here: dump_limit," in result.stderr


async def test_an_unknown_kvsi_variable_is_one_warning_at_start() -> None:
    async with services() as running:
        service = running.start("kvsi", "memory", None, env={"KVSI_STROE": "redis://x"})
        await service.serving()
        output = service.output()
    [line] = [line for line in output.splitlines() if "settings.unknown_variables" in line]
    assert "KVSI_STROE" in line


def test_a_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run([*KVSI, "serve", "--port", str(port)])
    assert_one_line(result, f"cannot listen on 127.0.0.1:{port}: Address already in use")


def test_a_redis_store_without_the_redis_client_names_the_extra() -> None:
    result = run([*WITHOUT_REDIS_CLIENT, "serve", "--store", "redis://127.0.0.1:1"])
    assert_one_line(result, "pip install 'kv-session-index[redis]'")


def assert_one_line(result: subprocess.CompletedProcess[str], says: str) -> None:
    shown = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 2, shown
    assert "Traceback" not in result.stderr + result.stdout, shown
    lines = [line for line in result.stderr.splitlines() if line.startswith("kvsi: error: ")]
    assert len(lines) == 1 and says in lines[0], shown
    assert result.stderr.strip().splitlines()[-1] == lines[0], shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@127.0.0.1:{port}/0", "redis://:***@127.0.0.1"),
        ("redis://127.0.0.1:{port}/0?password=hunter2", "/0?password=***"),
    ],
    ids=["in-the-authority", "in-the-query"],
)
async def test_an_unreachable_redis_is_one_warning_at_start_and_503s_one_line_each(
    url: str, shown: str
) -> None:
    """The password never reaches the output (the start line names the store too)."""
    with refusing_port() as closed:
        async with services() as running:
            service = running.start("kvsi", url.format(port=closed), None)
            base = await service.serving()
            async with httpx.AsyncClient(base_url=base, timeout=10) as client:
                for _ in range(5):
                    response = await client.get("/v1/sessions/s-1")
                    assert response.status_code == 503
                    assert "index store unavailable" in response.json()["detail"]
            output = service.output()
    warnings = [line for line in output.splitlines() if "store.unreachable" in line]
    assert len(warnings) == 1, output
    assert shown in warnings[0] and "hunter2" not in output, output
    (start,) = [line for line in output.splitlines() if "serve.start" in line]
    assert shown in start, start
    failures = [line for line in output.splitlines() if "store.call_failed" in line]
    assert 1 <= len(failures) < 5, output
    assert "Traceback" not in output, output


async def test_tail_says_when_nothing_arrives() -> None:
    port = free_port_run(1)
    notices: list[str] = []
    task = asyncio.create_task(
        tail(f"tcp://127.0.0.1:{port}", "kv@", None, quiet_notice=0.2, notice=notices.append)
    )

    async def two_notices() -> bool:
        return len(notices) >= 2

    try:
        await eventually(two_notices)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert f"no message from tcp://127.0.0.1:{port} with topic prefix 'kv@' yet" in notices[0]
