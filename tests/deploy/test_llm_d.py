"""deploy/llm-d (issue #9, item 1): the endpoint picker configurations name plugins llm-d
registers and read the headers kvsi sets; the Helm values and the ConfigMap carry them
unchanged; the reference proxy, run on loopback between a client, kvsi and a fake llm-d
gateway, sets the x-session-token that decodes to the pod holding most of the session."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from kvsi.api import create_app
from kvsi.api.routers.llm_d.hints import HintOptions
from kvsi.serve import hint_options
from kvsi.settings import LlmDConfig, load_settings
from kvsi.store.memory import MemoryStore
from kvsi.store.model import Batch, EntriesStored, WorkerKey, WorkerState, WorkerStatus
from tests.api.harness import client_for
from tests.children import tied
from tests.deploy.paths import DEPLOY, tool
from tests.ports import free_port, refusing_port
from tests.waiting import eventually

LLM_D = DEPLOY / "llm-d"
PROXY = LLM_D / "session_token_proxy.py"
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())

REGISTERED = {
    "queue-scorer",
    "kv-cache-utilization-scorer",
    "prefix-cache-scorer",
    "session-affinity-scorer",
    "session-affinity-filter",
    "header-label-affinity-scorer",
    "metrics-data-source",
    "core-metrics-extractor",
    "max-score-picker",
}
"""Plugin types llm-d-router v0.10.0 registers (cmd/epp/runner/runner.go, 71f4f0999f95)
that these configurations may use."""

ENDPOINTS = ["llm/pod-a-rank-0", "llm/pod-b-rank-0"]
"""The endpoints llm-d's picker makes of pods pod-a and pod-b (one target port) in `llm`."""


def epp_config(name: str) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load((LLM_D / name).read_text())
    return config


def plugin(config: dict[str, Any], type_: str) -> dict[str, Any]:
    (found,) = [p for p in config["plugins"] if p["type"] == type_]
    return found


def weights(config: dict[str, Any]) -> dict[str, float]:
    (profile,) = config["schedulingProfiles"]
    return {p["pluginRef"]: p.get("weight", 1.0) for p in profile["plugins"]}


def epp_session_affinity(headers: httpx.Headers | dict[str, str]) -> dict[str, float]:
    """llm-d's session-affinity-scorer over ENDPOINTS, as its README and code describe it:
    1 where the standard-base64-decoded header equals "<namespace>/<name>", 0 elsewhere."""
    named = base64.b64decode(headers.get("x-session-token", ""), validate=True).decode()
    return {endpoint: float(endpoint == named) for endpoint in ENDPOINTS}


def assert_loads_in_the_epp(config: dict[str, Any]) -> None:
    """What the EPP's loader needs of these files: its kind, registered plugin types, every
    reference declared, every scorer in the profile with a positive weight."""
    assert (config["apiVersion"], config["kind"]) == ("llm-d.ai/v1alpha1", "EndpointPickerConfig")
    assert {p["type"] for p in config["plugins"]} <= REGISTERED
    names = {p.get("name", p["type"]): p["type"] for p in config["plugins"]}
    scorers = {n for n, t in names.items() if t.endswith("-scorer")}
    assert set(weights(config)) <= set(names), "every reference declared"
    assert scorers <= set(weights(config)), "every scorer in the profile"
    assert all(weights(config)[n] > 0 for n in scorers)


@pytest.mark.parametrize("name", ["epp-config.yaml", "epp-config-label.yaml"])
def test_the_epp_configs_use_registered_plugins_and_weight_every_scorer(name: str) -> None:
    assert_loads_in_the_epp(epp_config(name))


def test_the_session_scorer_reads_the_header_kvsi_sets() -> None:
    token = plugin(epp_config("epp-config.yaml"), "session-affinity-scorer")
    assert token["parameters"] == {
        "strategy": "encoded_endpoint_header",
        "encodedEndpointHeaderConfig": {"header": LlmDConfig().header},
    }
    label = plugin(epp_config("epp-config-label.yaml"), "header-label-affinity-scorer")
    assert label["parameters"]["headerName"] == LlmDConfig().label_header
    assert label["parameters"]["labelKey"] == "statefulset.kubernetes.io/pod-name"


def test_the_helm_values_run_the_same_config_with_experimental_plugins_allowed() -> None:
    values = yaml.safe_load((LLM_D / "values-llm-d-router.yaml").read_text())["router"]["epp"]
    assert values["flags"] == {"allow-experimental-plugins": True}
    embedded = values["pluginsCustomConfig"][values["pluginsConfigFile"]]
    assert yaml.safe_load(embedded) == epp_config("epp-config.yaml")


def test_the_config_map_carries_both_configs_and_is_valid() -> None:
    rendered = subprocess.run(
        [tool("kubectl"), "kustomize", str(LLM_D)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    (config_map,) = [d for d in yaml.safe_load_all(rendered) if d]
    assert config_map["kind"] == "ConfigMap"
    for version in VERSIONS:
        kubernetes_validate.validate(config_map, version, strict=True)
    for name in ("epp-config.yaml", "epp-config-label.yaml"):
        assert config_map["data"][name] == (LLM_D / name).read_text()


# --- the reference proxy, end to end on loopback ---


def load_proxy() -> ModuleType:
    """The proxy script as a module (it is a file to copy, not a package)."""
    if "session_token_proxy" in sys.modules:
        return sys.modules["session_token_proxy"]
    spec = importlib.util.spec_from_file_location("session_token_proxy", PROXY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["session_token_proxy"] = module  # its dataclass resolves names through it
    spec.loader.exec_module(module)
    return module


@asynccontextmanager
async def serving(app: ASGIApp, host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """`app` on a loopback address (a free port unless given) for the block: its base URL."""
    port = port or free_port()
    config = uvicorn.Config(app, host=host, port=port, log_config=None, lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())

    async def started() -> bool:
        return bool(server.started)

    await eventually(started, within=10)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


class Gateway:
    """A stand-in llm-d gateway: records each request, answers 201 with a streamed body."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.app = Starlette(routes=[Route("/{path:path}", self.answer, methods=["POST", "GET"])])

    async def answer(self, request: Request) -> Response:
        self.seen.append(
            {
                "path": request.scope["raw_path"].decode(),  # as sent, escapes kept
                "query": request.url.query,
                "headers": request.headers,
                "body": await request.body(),
            }
        )

        async def chunks() -> AsyncIterator[bytes]:
            for part in (b"data: one\n\n", b"data: two\n\n"):
                yield part

        response = StreamingResponse(chunks(), status_code=201, media_type="text/event-stream")
        response.raw_headers += [(b"set-cookie", b"a=1"), (b"set-cookie", b"b=2")]
        return response


async def session_on_two_pods(pods: tuple[str, str] = ("pod-a", "pod-b")) -> MemoryStore:
    """Session `s`: 2 blocks on the first pod, 5 on the second."""
    store = MemoryStore()
    for pod, hashes in zip(pods, ([1, 2], [1, 2, 3, 4, 5]), strict=True):
        worker = WorkerKey(pod, 0)
        await store.set_status(worker, WorkerStatus(WorkerState.LIVE, 1.0))
        await store.apply(worker, Batch(0, 1.0, [EntriesStored(hashes, "GPU", 0, "s")]))
    return store


@contextmanager
def proxy_process(*args: str) -> Iterator[str]:
    """The proxy script as its own process, the way deploy/llm-d documents running it."""
    port = free_port()
    command = [sys.executable, str(PROXY), "--listen", f"127.0.0.1:{port}", *args]
    process = subprocess.Popen(tied(command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        assert process.wait(10) is not None


async def accepting(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as client:
            await client.get(url + "/healthz", timeout=0.5)
    except httpx.TransportError:
        return False
    return True


@pytest.mark.e2e
async def test_an_llm_d_request_through_the_proxy_carries_the_token_of_the_pod_holding_most() -> (
    None
):
    gateway = Gateway()
    kvsi = create_app(await session_on_two_pods(), hint_options=HintOptions(namespace="llm"))
    async with serving(kvsi) as kvsi_url, serving(gateway.app) as gateway_url:
        with proxy_process("--upstream", gateway_url, "--kvsi", kvsi_url) as proxy:
            await eventually(lambda: accepting(proxy), within=20)
            gateway.seen.clear()
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            async with httpx.AsyncClient(base_url=proxy) as client:
                answer = await client.post(
                    "/v1/chat/completions?stream=1",
                    content=body,
                    headers={"x-session-id": "s", "content-type": "application/json"},
                )
    (seen,) = gateway.seen
    assert epp_session_affinity(seen["headers"]) == {
        "llm/pod-a-rank-0": 0.0,
        "llm/pod-b-rank-0": 1.0,
    }
    assert (seen["path"], seen["query"], seen["body"]) == (
        "/v1/chat/completions",
        "stream=1",
        body.encode(),
    )
    assert seen["headers"]["x-session-id"] == "s"
    assert answer.status_code == 201
    assert answer.text == "data: one\n\ndata: two\n\n"
    assert answer.headers.get_list("set-cookie") == ["a=1", "b=2"]


@asynccontextmanager
async def proxied(kvsi_url: str, gateway_url: str, **options: Any) -> AsyncIterator[str]:
    """The proxy in this process (its ASGI app on uvicorn), for the cases around the path."""
    proxy = load_proxy()
    config = proxy.ProxyConfig(upstream=gateway_url, kvsi=kvsi_url, **options)
    async with serving(proxy.create_proxy(config)) as url:
        yield url


@pytest.mark.e2e
async def test_the_session_may_come_in_the_body_and_unknown_ones_keep_the_clients_token() -> None:
    gateway = Gateway()
    kvsi = create_app(await session_on_two_pods(), hint_options=HintOptions(namespace="llm"))
    own = base64.b64encode(b"llm/pod-a-rank-0").decode()
    async with (
        serving(kvsi) as kvsi_url,
        serving(gateway.app) as gateway_url,
        proxied(kvsi_url, gateway_url) as proxy,
        httpx.AsyncClient(base_url=proxy) as client,
    ):
        await client.post("/v1/completions", json={"session_id": "s", "prompt": "x"})
        await client.post(
            "/v1/completions", headers={"x-session-id": "never-seen", "x-session-token": own}
        )
        await client.post("/v1/completions", json={"prompt": "no session"})
        await client.post("/v1/completions", headers={"x-session-id": "s", "x-session-token": own})
    body, unknown, none, replaced = (s["headers"] for s in gateway.seen)
    assert epp_session_affinity(body)["llm/pod-b-rank-0"] == 1.0
    assert unknown["x-session-token"] == own
    assert "x-session-token" not in none
    assert replaced.getlist("x-session-token") == [base64.b64encode(b"llm/pod-b-rank-0").decode()]


@pytest.mark.e2e
async def test_the_proxy_sends_kvsis_token_and_fails_open_when_kvsi_cannot_answer() -> None:
    gateway = Gateway()
    guarded = create_app(await session_on_two_pods(), tokens=["s3cret"])
    with refusing_port() as closed:
        down = f"http://127.0.0.1:{closed}"
        async with (
            serving(guarded) as kvsi_url,
            serving(gateway.app) as gateway_url,
            proxied(kvsi_url, gateway_url, token="s3cret", form="label") as with_token,
            proxied(kvsi_url, gateway_url) as without_token,
            proxied(down, gateway_url) as kvsi_down,
            proxied(kvsi_url, down) as gateway_down,
        ):
            answers = []
            for proxy in (with_token, without_token, kvsi_down, gateway_down):
                async with httpx.AsyncClient(base_url=proxy) as client:
                    answer = await client.post("/v1/completions", headers={"x-session-id": "s"})
                answers.append(answer)
    assert [a.status_code for a in answers] == [201, 201, 201, 502]
    labelled, unauthorized, unreachable = (s["headers"] for s in gateway.seen)
    assert labelled["x-kvsi-pod"] == "pod-b"
    assert "x-kvsi-pod" not in unauthorized and "x-session-token" not in unauthorized
    assert "x-session-token" not in unreachable
    assert "upstream unreachable" in answers[3].text


@pytest.mark.e2e
async def test_as_a_plain_proxy_it_sends_a_hinted_request_to_the_pod_holding_most() -> None:
    # Pods named by loopback addresses: the pod URL template resolves without DNS.
    pods = ("127.0.0.2", "127.0.0.3")
    service, pod_a, pod_b = Gateway(), Gateway(), Gateway()
    port = free_port()
    kvsi = create_app(await session_on_two_pods(pods))
    async with (
        serving(kvsi) as kvsi_url,
        serving(service.app) as service_url,
        serving(pod_a.app, pods[0], port),
        serving(pod_b.app, pods[1], port),
        proxied(kvsi_url, service_url, pod_url=f"http://{{pod}}:{port}") as proxy,
        httpx.AsyncClient(base_url=proxy) as client,
    ):
        hinted = await client.post("/v1/models/org%2Fname", headers={"x-session-id": "s"})
        unknown = await client.post("/v1/completions", headers={"x-session-id": "other"})
    assert (hinted.status_code, unknown.status_code) == (201, 201)
    assert [s["path"] for s in pod_b.seen] == ["/v1/models/org%2Fname"]
    assert pod_b.seen[0]["headers"]["x-session-token"]
    assert pod_a.seen == []
    assert [s["path"] for s in service.seen] == ["/v1/completions"]


# --- the router pages' snippets ---

DOCS = DEPLOY.parent / "docs" / "routers"


def blocks(page: str, language: str) -> list[str]:
    """The page's fenced code blocks in `language`, in order."""
    text = (DOCS / page).read_text()
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def proxy_commands(page: str) -> list[list[str]]:
    """The page's `python deploy/llm-d/session_token_proxy.py ...` commands, as arguments."""
    commands = []
    for block in blocks(page, "bash"):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            words = shlex.split(line)
            if words[:2] == ["python", "deploy/llm-d/session_token_proxy.py"]:
                commands.append(words[2:])
    return commands


async def test_the_llm_d_pages_settings_give_the_answer_it_shows(tmp_path: Path) -> None:
    (toml,) = blocks("llm-d.md", "toml")
    (tmp_path / "kvsi.toml").write_text(toml)
    options = hint_options(load_settings(tmp_path / "kvsi.toml"))
    assert options.namespace_of("vllm-batch-0") == "llm-batch"
    store = MemoryStore()
    for pod, count in (("vllm-7d9c4f-k5n2p", 12), ("vllm-7d9c4f-x2x8q", 30)):
        worker = WorkerKey(pod, 0)
        await store.set_status(worker, WorkerStatus(WorkerState.LIVE, 1.0))
        stored = EntriesStored(list(range(count)), "GPU", 0, "sess-00182")
        await store.apply(worker, Batch(0, 1.0, [stored]))
    async with client_for(create_app(store, hint_options=options)) as client:
        answer = await client.get("/v1/sessions/sess-00182/hint?format=llm-d")
    shown = json.loads(blocks("llm-d.md", "json")[0])
    assert answer.json() == shown
    token = base64.b64decode(shown["headers"]["x-session-token"]).decode()
    assert token == shown["target"]


def test_the_llm_d_pages_epp_configs_load_and_the_first_is_the_shipped_one() -> None:
    configs = [yaml.safe_load(b) for b in blocks("llm-d.md", "yaml")]
    assert len(configs) == 2
    for config in configs:
        assert_loads_in_the_epp(config)
    assert configs[0] == epp_config("epp-config.yaml")
    assert plugin(configs[1], "session-affinity-filter")["name"] == "kvsi-session-pin"


@pytest.mark.parametrize("page", ["llm-d.md", "proxy.md"])
def test_the_pages_proxy_commands_are_accepted_by_the_proxy(page: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t0k3n\n")
    commands = proxy_commands(page)
    assert commands, f"{page} shows how to run the proxy"
    for args in commands:
        mounted = [str(token) if a == "/var/run/kvsi/token" else a for a in args]
        config, host, port = load_proxy()._config(mounted)
        assert (host, port) == ("0.0.0.0", 8080)
        assert config.kvsi == "http://kvsi-api.llm.svc:8000"
        assert config.token == ("t0k3n" if "--token-file" in args else None)


def test_the_router_index_links_every_page() -> None:
    index = (DOCS / "README.md").read_text()
    linked = set(re.findall(r"\]\(([\w./-]+\.md)\)", index))
    assert {"llm-d.md", "dynamo.md", "proxy.md"} <= linked
    assert all((DOCS / link).is_file() for link in linked)
