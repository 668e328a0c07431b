"""The one settings object: defaults, a TOML file, `KVSI_*` environment variables, CLI flags.

Imports pydantic only. Precedence: CLI flags > environment > config file > defaults.
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from collections.abc import Iterable, Sequence
from pathlib import Path
from string import Formatter
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FilePath,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from kvsi.errors import StartupError, describe_settings_error, describe_validation
from kvsi.store.directory import MAX_IDLE_SECONDS
from kvsi.store.endpoints import zmq_endpoint

POD_NAME = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
"""A Kubernetes object name (RFC 1123 subdomain), as the API accepts pods."""
K8S_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A namespace name (RFC 1123 label)."""
HEADER_NAME = r"^[a-z0-9][a-z0-9-]{0,62}$"
"""A lowercase header name: llm-d's picker lowercases the names it is configured with."""
URL_PATH = r"^(/[A-Za-z0-9._~-]+)+$"
"""A path to mount an API at: one or more /segments."""

PATTERN_WORDS = {
    POD_NAME: "must be a Kubernetes name: lowercase letters, digits, '-' and '.', starting "
    "and ending with a letter or digit",
    K8S_LABEL: "must be a Kubernetes namespace name: lowercase letters, digits and '-', "
    "starting and ending with a letter or digit",
    HEADER_NAME: "must be a lowercase header name: letters, digits and '-'",
    URL_PATH: "must be a URL path such as /dynamo",
}
"""The rule each pattern states, in words, for the one-line error (never the regex)."""


class PublisherConfig(BaseModel):
    """One vLLM KV-event publisher (one pod, one data-parallel rank)."""

    model_config = ConfigDict(extra="forbid")

    pod: str = Field(pattern=POD_NAME, max_length=253)
    """Pod name (a Kubernetes name, as the API accepts); the worker is (pod, the batch's rank)."""
    endpoint: str
    """ZMQ endpoint of the PUB socket, e.g. tcp://10.0.0.5:5557 or ipc:///tmp/kv.sock."""
    replay_endpoint: str | None = None
    """ZMQ endpoint of the replay ROUTER socket, if the engine has one."""
    dp_rank: int = Field(default=0, ge=0)
    """Rank assumed until a batch names its own."""
    topic: str | None = None
    """Topic prefix filter; None uses the global `topic`."""
    model: str | None = Field(default=None, min_length=1, max_length=256)
    """The model the engine serves (routes and the Dynamo API filter by it); None: the one
    its topic `kv@<pod>@<model>` names, if it does."""

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _zmq_endpoint(cls, value: str | None) -> str | None:
        return None if value is None else zmq_endpoint(value)


def default_replica_id() -> str:
    """`POD_NAME` (set from the Downward API in deploy/), else `<host name>-<process id>`."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


class DiscoveryConfig(BaseModel):
    """Central mode: find vLLM pods through the Kubernetes API instead of listing publishers.

    A pod's annotations `kv-session-index/events-port`, `kv-session-index/replay-port` and
    `kv-session-index/dp-size` override the defaults below for that pod.
    """

    model_config = ConfigDict(extra="forbid")

    labels: dict[str, str] = Field(min_length=1)
    """Label selector (every pair must match), e.g. {"app.kubernetes.io/name": "vllm"}."""
    namespace: str | None = None
    """Namespace to watch; None: the client's default (in a cluster, the pod's own)."""
    events_port: int = Field(default=5557, ge=1, le=65535)
    """Port of data-parallel rank 0's PUB socket; rank r publishes on events_port + r."""
    replay_port: int | None = Field(default=5657, ge=1, le=65535)
    """Port of rank 0's replay ROUTER (rank r: replay_port + r); None: no replay. vLLM
    offsets both ports by the rank, so with data parallelism keep them dp_size apart."""
    dp_size: int = Field(default=1, ge=1, le=256)
    """Data-parallel ranks per pod: one worker each."""
    grace_seconds: float = Field(default=60.0, ge=0)
    """A worker whose pod is gone (deleted, or no longer running) keeps its index this long
    in case the pod returns under the same name, then it is removed with all its data."""
    split: bool = False
    """Several central replicas split the pods among themselves (a shared store only): each
    replica beats a record with a TTL in the store, and every pod is followed by the one
    live replica rendezvous hashing names (kvsi/ownership.py). False: this process follows
    every pod it discovers (replicas on the same pods then each apply every batch, which
    the fence makes harmless)."""
    replica_id: str = Field(default_factory=default_replica_id, min_length=1)
    """This replica's name among the splitting replicas: unique per process. Default: the
    `POD_NAME` environment variable (the Downward API), else the host name and process id."""
    beat_seconds: float = Field(default=1.0, gt=0)
    """How often a splitting replica renews its record and reads the live replicas: a
    replica joining or leaving (SIGTERM) is seen by the others within this."""
    replica_ttl_seconds: float = Field(default=5.0, gt=0)
    """A replica whose record was not renewed for this long (killed, partitioned from the
    store) is no longer live and its pods go to the others: with one beat_seconds more,
    the longest a lost replica's pods go unfollowed; the new owner replays the batches
    published meanwhile from the stored fence (vLLM's replay buffer must reach that far)."""

    @model_validator(mode="after")
    def _ttl_outlasts_beats(self) -> DiscoveryConfig:
        if self.replica_ttl_seconds < 2 * self.beat_seconds:
            raise ValueError(
                "replica_ttl_seconds must be at least twice beat_seconds (one late beat must "
                "not make a live replica look lost)"
            )
        return self


class DynamoConfig(BaseModel):
    """Dynamo's standalone KV indexer API (`dynamo_api`): where it is served, how much
    `/dump` returns. docs/routers/dynamo.md has the rest."""

    model_config = ConfigDict(extra="forbid")

    prefix: str = Field(default="/dynamo", pattern=URL_PATH)
    """Path the API is mounted at on the main port: `<prefix>/query_by_hash`, ..."""
    port: int | None = Field(default=None, ge=0, le=65535)
    """Also serve it at the root of this port of `host`, as `python -m dynamo.indexer` does
    (8090 there): a drop-in for its clients. None: only under `prefix`."""
    dump_limit: int = Field(default=10_000, ge=1, le=1_000_000)
    """Most block hashes one `/dump` lists over all workers; beyond, it says `truncated`."""
    follow_seconds: float = Field(default=2.0, gt=0)
    """How often an ingest process reads the registrations, to subscribe to instances
    registered since and let go of those unregistered."""


class LlmDConfig(BaseModel):
    """The session hint llm-d's endpoint picker reads (`GET /v1/sessions/{id}/hint`, and
    `/v1/route` with `hint`): how a kvsi worker is named there. docs/routers/llm-d.md."""

    model_config = ConfigDict(extra="forbid")

    namespace: str = Field(default="default", max_length=63, pattern=K8S_LABEL)
    """Namespace of the vLLM pods (their InferencePool's): the token names `<namespace>/...`."""
    pod_namespaces: dict[str, Annotated[str, Field(max_length=63, pattern=K8S_LABEL)]] = {}
    """Pod-name prefix -> namespace, for pods outside `namespace`; the longest prefix wins."""
    endpoint: str = Field(default="{pod}-rank-{rank}", min_length=5, max_length=253)
    """The picker's name of a worker's endpoint, from `{pod}` and `{rank}` (its DP rank). The
    picker names endpoints `<pod>-rank-<i>`, i the index of the port in the InferencePool's
    targetPorts: `{pod}-rank-{rank}` when DP rank r serves the r-th port, `{pod}-rank-0` when
    a pod serves every rank behind one port, `{pod}` for pickers older than that naming.
    Without `{rank}` the hint names a pod, ranked on its ranks' blocks together."""
    header: str = Field(default="x-session-token", pattern=HEADER_NAME)
    """The header session-affinity-scorer reads (its `encodedEndpointHeaderConfig.header`)."""
    label_header: str = Field(default="x-kvsi-pod", pattern=HEADER_NAME)
    """The header a header-label-affinity-scorer reads (`format=label`); its value is the pod
    name, so the scorer's `labelKey` must be a label holding the pod's own name."""

    @field_validator("endpoint")
    @classmethod
    def _endpoint_template(cls, value: str) -> str:
        try:
            fields = {name for _, name, _, _ in Formatter().parse(value) if name is not None}
        except ValueError as exc:
            raise ValueError(f"endpoint {value!r} is not a template ({exc})") from exc
        if "pod" not in fields or not fields <= {"pod", "rank"}:
            raise ValueError(f"endpoint {value!r} must use {{pod}}, and only {{rank}} besides")
        try:
            sample = value.format(pod="vllm-0", rank=0)
        except ValueError as exc:
            raise ValueError(f"endpoint {value!r} cannot be formatted ({exc})") from exc
        if re.fullmatch(POD_NAME, sample) is None:
            raise ValueError(f"endpoint {value!r} must make a Kubernetes name (makes {sample!r})")
        return value


class Settings(BaseSettings):
    """Everything `kvsi serve` can be told."""

    model_config = SettingsConfigDict(
        env_prefix="KVSI_",
        env_nested_delimiter="__",
        use_attribute_docstrings=True,
        extra="forbid",
    )

    store: str = "memory"
    """Index store: `memory` (embedded) or a Redis URL (redis://, rediss://, redis+cluster://)."""
    publishers: list[PublisherConfig] = []
    """vLLM publishers to subscribe to."""
    topic: str = ""
    """Default ZMQ topic prefix filter ("" receives every topic)."""
    host: str = "127.0.0.1"
    """Address the HTTP API binds."""
    port: int = Field(default=8000, ge=0, le=65535)
    """Port the HTTP API binds."""
    api: bool = True
    """Serve the HTTP API (off for an ingest-only sidecar)."""
    api_tokens: list[str] = []
    """Bearer tokens accepted by every /v1 endpoint; empty: no access control."""
    api_tokens_file: FilePath | None = None
    """A file with one bearer token per line (a mounted Kubernetes Secret), added to
    `api_tokens`; re-read at start only. It must exist when the service starts."""
    api_require_token: bool = False
    """Refuse to start the API with no token configured (an empty or missing tokens file
    then fails the start instead of serving an open API). The shipped manifests set it."""
    metrics_require_token: bool = False
    """Also require a bearer token on /metrics (the probes always stay open)."""
    max_body_bytes: int = Field(default=12 * 1024 * 1024, ge=1024)
    """Largest request body the APIs (REST and Dynamo) take, in bytes; a larger one is a 413,
    refused before it is read whole. The default is above the largest legal request: the
    Dynamo API's `/query` with 1,048,576 token ids of 10 digits (11.5 MB); `/v1/route`'s
    largest, 262,144 token ids, is under 3.2 MB."""
    ingest: bool = True
    """Subscribe to publishers (off for an API-only replica)."""
    discovery: DiscoveryConfig | None = None
    """Central mode: subscribe to every vLLM pod the Kubernetes API lists (needs the `k8s`
    extra); None: only the configured `publishers`."""
    dynamo_api: bool = False
    """Serve Dynamo's standalone KV indexer API (see `dynamo`); with ingest on, also
    subscribe to the instances registered through it."""
    dynamo: DynamoConfig = Field(default_factory=DynamoConfig)
    """Options of the Dynamo API (used only with `dynamo_api`)."""
    llm_d: LlmDConfig = Field(default_factory=LlmDConfig)
    """How session hints name llm-d endpoints (`GET /v1/sessions/{id}/hint`)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    """With the API off (an ingest-only sidecar), serve /healthz, /readyz and /metrics on
    this port of `host`; None: serve no HTTP at all."""
    index_metrics_interval_seconds: float = Field(default=15.0, gt=0)
    """How often the index size gauges (workers, sessions, entries) are read from the store."""
    session_idle_seconds: float = Field(default=3600.0, gt=0)
    """A session residency (session, worker) with no store of the session on that worker
    for this long (engine time) is dropped, whatever blocks it holds; the blocks stay in the
    worker's index (a shared system prompt is still matched). A session left with no
    residency is forgotten."""
    worker_grace_seconds: float = Field(default=600.0, gt=0)
    """A worker disconnected for longer than this is removed with all its data."""
    gc_freeze_interval_seconds: float = Field(default=2.0, gt=0)
    """How often surviving objects are frozen out of the garbage collector's scans (keeps
    full collections over a large in-memory index from stalling the API)."""
    janitor_interval_seconds: float = Field(default=30.0, gt=0)
    """How often idle session residencies and gone workers are looked for (a pass drops a
    bounded number of residencies per worker, `kvsi.janitor.EXPIRY_LIMIT`, and runs again
    at once when it left some)."""
    ingest_queue_size: int = Field(default=10_000, ge=1)
    """Live messages held per publisher between receiving and applying (the buffer that
    rides out a slow or unavailable store). Beyond it, messages are dropped and the hole is
    repaired by replay; vLLM's buffer_steps (10,000 by default) is how far back that reaches."""
    replay_timeout_seconds: float = Field(default=2.0, gt=0)
    """Longest wait for the next message of a replay reply before the attempt fails."""
    replay_attempts: int = Field(default=3, ge=1)
    """Replay attempts in a row that receive nothing before the gap is declared lost and the
    worker degraded; each resumes after the last batch received, and one that moved the
    replay on does not count (a ROUTER drops replies at its high-water mark when the store
    applies slower than the publisher sends)."""
    max_concurrent_replays: int = Field(default=4, ge=1)
    """Replays in flight at once over all publishers, so a fleet reconnecting together does
    not flood its engines and the store."""
    max_workers: int = Field(default=1024, ge=1)
    """Workers one process is sized to follow, or the configured publishers if more: the ZMQ
    context's socket limit and the file limit raised at start are counted for them. Central
    mode and Dynamo registrations add workers up to it; a worker past it (or past what the
    hard file limit allows) stays `degraded`, saying why, and `/readyz` fails."""
    unconfirmed_ttl_seconds: float = Field(default=300.0, gt=0)
    """Stale policy: after a gap that replay could not repair, a worker's entries that no
    event reconfirms within this time are dropped (the index may then under-report that
    worker, never over-report it). See subscriber/README.md."""
    store_retry_max_seconds: float = Field(default=2.0, gt=0)
    """Longest pause between ingest's attempts to reach an unavailable index store."""
    index_audit_seconds: float = Field(default=5.0, gt=0)
    """How often each stream checks that the store still holds what it stored (a Redis
    back without its data is rebuilt by replay) and stores its worker's status again."""
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    """The service's event loop: `uvloop` (libuv's, a dependency: less CPU per request and
    per event than asyncio's own, bench/README.md), `asyncio` (the standard library's), or
    `auto`: uvloop where it is installed, else asyncio."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """Log threshold."""
    log_format: Literal["json", "console"] = "console"
    """`json` for log shippers, `console` for people."""
    access_log: bool = True
    """Log one line per HTTP request (route, status, duration, session or pod, request id).
    Off: requests are still counted and timed in /metrics and failures still logged, and a
    busy API spends less CPU per request (bench/README.md, api_cpu.py)."""
    demo: bool = False
    """Start a simulated fleet of vLLM pods in-process and subscribe to it."""
    demo_pods: int = Field(default=3, ge=1, le=64)
    """Simulated pods in the demo."""
    demo_rate: float = Field(default=20.0, gt=0)
    """Batches per second per simulated pod in the demo."""
    demo_base_port: int = Field(default=0, ge=0, le=65535)
    """First loopback port of the demo fleet (0: pick free ports)."""

    @model_validator(mode="after")
    def _demo_ports_fit(self) -> Settings:
        last = self.demo_base_port + 2 * self.demo_pods - 1
        if self.demo_base_port and last > 65535:
            raise ValueError(f"demo_base_port: {self.demo_pods} demo pods need ports up to {last}")
        return self

    @model_validator(mode="after")
    def _idle_within_the_directory(self) -> Settings:
        # A Redis session directory entry outlives its writer's last assert by a bounded
        # time (store/redis/directory.py); a residency must expire before its entry can.
        if self.store != "memory" and self.session_idle_seconds > MAX_IDLE_SECONDS:
            raise ValueError(
                f"session_idle_seconds: at most {MAX_IDLE_SECONDS:.0f} on Redis (a session "
                "directory entry must outlive the residency it names)"
            )
        return self

    @model_validator(mode="after")
    def _discovery_needs_ingest(self) -> Settings:
        if self.discovery is not None and not self.ingest:
            raise ValueError("discovery (central mode) subscribes to pods: it needs ingest on")
        return self

    @model_validator(mode="after")
    def _split_needs_a_shared_store(self) -> Settings:
        if self.discovery is not None and self.discovery.split and self.store == "memory":
            raise ValueError(
                "discovery.split needs a shared store (redis://...): on the memory store each "
                "replica holds its own index, so each must follow every pod"
            )
        return self


def unknown_variables(names: Iterable[str]) -> list[str]:
    """The `KVSI_*` names among `names` that set no setting: pydantic-settings ignores them,
    so a typo (`KVSI_STROE`) would silently leave the default in place."""
    unknown = []
    for name in names:
        if not name.startswith("KVSI_"):
            continue
        *table, leaf = name.removeprefix("KVSI_").lower().split("__")
        valid = setting_names(table)
        if valid is None or leaf not in valid:
            unknown.append(name)
    return unknown


def setting_names(path: Sequence[str | int]) -> list[str] | None:
    """The names the settings take at `path` (`[]`: the top level; `["publishers", 0]`: a
    publisher's), or None where no table is."""
    model: Any = Settings
    for part in path:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        model = _model_of(field.annotation)
        if model is None:
            return None
    return sorted(model.model_fields)


def _model_of(annotation: Any) -> Any:
    """The pydantic model a setting holds (`DiscoveryConfig | None`, `list[PublisherConfig]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in get_args(annotation):
        found = _model_of(argument)
        if found is not None:
            return found
    return None


def bearer_tokens(settings: Settings) -> list[str]:
    """Every configured token: the setting's plus the file's (blank and # lines skipped)."""
    tokens = list(settings.api_tokens)
    if settings.api_tokens_file is not None:
        try:
            text = settings.api_tokens_file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise StartupError(f"api_tokens_file {settings.api_tokens_file}: {exc}") from exc
        for line in text.splitlines():
            token = line.strip()
            if token and not token.startswith("#"):
                tokens.append(token)
    if settings.api and settings.api_require_token and not tokens:
        raise StartupError(
            "api_require_token is set but no token is configured: put one per line in "
            "api_tokens_file (or set api_tokens)"
        )
    return tokens


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Settings from the file (if any), the environment and `overrides` (CLI flags).

    Raises StartupError, one line naming the file, variable or setting that is wrong."""

    class _WithFile(Settings):
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
            if config_file is not None:
                sources += (TomlConfigSettingsSource(settings_cls, toml_file=config_file),)
            return sources

    if config_file is not None and not config_file.is_file():
        problem = "is not a file" if config_file.exists() else "does not exist"
        raise StartupError(f"config file {config_file} {problem}")
    try:
        loaded = _WithFile(**overrides)
        settings = Settings.model_validate(loaded.model_dump())
        bearer_tokens(settings)
    except tomllib.TOMLDecodeError as exc:
        raise StartupError(f"config file {config_file} is not valid TOML: {exc}") from exc
    except SettingsError as exc:
        raise StartupError(describe_settings_error(exc, os.environ)) from exc
    except ValidationError as exc:
        raise StartupError(describe_validation(exc, setting_names, PATTERN_WORDS)) from exc
    return settings
