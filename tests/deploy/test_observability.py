"""What operators see, from real `kvsi serve` processes: the metrics the Grafana dashboard
queries exist under those names, API metrics are labelled by route template and status,
the index size gauges count the index, logs are JSON with worker and session fields, and an
ingest-only process serves its probes and metrics (and no API) on --metrics-port."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.children import tied
from tests.deploy.manifests import rendered
from tests.deploy.paths import DEPLOY
from tests.ports import free_port
from tests.waiting import until_sync

pytestmark = pytest.mark.e2e

DASHBOARD = DEPLOY / "grafana" / "kv-session-index.json"
RULES = DEPLOY / "components" / "monitoring" / "prometheusrule.yaml"
ALERTED = {
    "kvsi_worker_degraded",
    "kvsi_publisher_connected",
    "kvsi_worker_lag_seconds",
    "kvsi_batches_lost_total",
    "kvsi_index_lost_total",
    "kvsi_fleet_decode_drops_total",
    "kvsi_store_available",
}
"""What the alerts must watch: a degraded or disconnected worker, lag, lost batches, index
lost, decode drops, the store unavailable (issue #14's list)."""
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}
REQUIRED = {
    # ingest: events, batches, gaps, replays, restarts, decode errors, apply latency, lag
    "kvsi_block_events_total",
    "kvsi_fleet_batches_total",
    "kvsi_seq_gaps_total",
    "kvsi_fleet_replays_total",
    "kvsi_engine_restarts_total",
    "kvsi_fleet_decode_drops_total",
    "kvsi_apply_seconds_bucket",
    "kvsi_worker_lag_seconds",
    # index sizes
    "kvsi_index_workers",
    "kvsi_index_sessions",
    "kvsi_index_entries",
    # API: requests, latency by route, status
    "kvsi_http_requests_total",
    "kvsi_http_request_seconds_bucket",
}
"""What the dashboard must chart (issue #5's list)."""


@contextmanager
def kvsi(
    log: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m kvsi ARGS` with JSON logs into `log`; stopped with SIGTERM, must exit 0."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            tied([sys.executable, "-m", "kvsi", *args]),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=os.environ | {"KVSI_LOG_FORMAT": "json", "PYTHONUNBUFFERED": "1"} | (env or {}),
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    assert proc.returncode == 0, log.read_text()[-3000:]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_until(check: object, what: str, proc: subprocess.Popen[bytes], within: float = 45) -> None:
    def ready() -> bool:
        assert proc.poll() is None, f"kvsi exited while waiting for {what}"
        return bool(check())  # type: ignore[operator]

    until_sync(ready, within, what, tolerate=(OSError,), every=0.2)


def samples(metrics_text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def exported_names(metrics_text: str) -> set[str]:
    """Every sample name a family can have, sampled yet or not (a labelled counter that
    never counted is declared but has no sample)."""
    names = set()
    for family in text_string_to_metric_families(metrics_text):
        for suffix in SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def dashboard_queries() -> list[str]:
    """Every panel's query and every variable's."""
    board = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    queries += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    assert all(p.get("targets") for p in board["panels"] if p["type"] != "row")
    return queries


def alert_queries() -> list[str]:
    rule = yaml.safe_load(RULES.read_text())
    return [r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]]


def logs(output: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def test_dashboard_metrics_api_and_index_metrics_and_json_logs_from_a_running_service(
    tmp_path: Path,
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {"KVSI_INDEX_METRICS_INTERVAL_SECONDS": "0.2"}
    log = tmp_path / "kvsi.log"
    with kvsi(log, "serve", "--demo", "--port", str(port), env=env) as proc:

        def listed() -> bool:
            return bool(json.loads(get(f"{base}/v1/sessions?limit=1")[1]).get("sessions"))

        wait_until(listed, "sessions", proc)
        session = json.loads(get(f"{base}/v1/sessions?limit=1")[1])["sessions"][0]["session_id"]
        assert get(f"{base}/v1/sessions/{session}")[0] == 200
        assert get(f"{base}/v1/sessions/no-such-session")[0] == 404
        assert get(f"{base}/v1/pods")[0] == 200

        def index_counted() -> bool:
            found = samples(get(f"{base}/metrics")[1])
            return found.get("kvsi_index_workers", [({}, 0)])[0][1] == 3

        wait_until(index_counted, "index gauges", proc)
        text = get(f"{base}/metrics")[1]
    found = samples(text)

    missing = {
        name
        for query in dashboard_queries()
        for name in re.findall(r"\bkvsi_[a-z0-9_]+", query)
        if name not in exported_names(text)
    }
    assert missing == set(), f"the dashboard queries metrics the code does not export: {missing}"
    charted = {n for q in dashboard_queries() for n in re.findall(r"\bkvsi_[a-z0-9_]+", q)}
    assert charted >= REQUIRED, REQUIRED - charted
    alerted = {n for q in alert_queries() for n in re.findall(r"\bkvsi_[a-z0-9_]+", q)}
    assert alerted - exported_names(text) == set(), "the alerts watch metrics nobody exports"
    assert alerted >= ALERTED, ALERTED - alerted

    requests = {
        (labels["route"], labels["status"]): value
        for labels, value in found["kvsi_http_requests_total"]
    }
    assert requests[("/v1/sessions/{session_id}", "200")] >= 1
    assert requests[("/v1/sessions/{session_id}", "404")] >= 1
    assert not any(session in route for route, _ in requests), "templates, never raw paths"
    latency = {labels["route"] for labels, _ in found["kvsi_http_request_seconds_count"]}
    assert "/v1/pods" in latency
    ((build, shown),) = found["kvsi_build_info"]
    assert shown == 1 and build["core"] == "native" and build["version"], build
    entries = {labels["worker"]: v for labels, v in found["kvsi_index_entries"]}
    assert len(entries) == 3 and all(v > 0 for v in entries.values())
    assert all(labels["worker"] in entries for labels, _ in found["kvsi_index_sessions"])

    lines = logs(log.read_text())
    (start,) = [line for line in lines if line.get("event") == "serve.start"]
    assert (start["version"], start["core"]) == (build["version"], "native"), start
    assert start["store"] == "memory" and start["ingest"] is True and start["api"] is True
    connected = [line for line in lines if line.get("event") == "stream.connected"]
    assert connected and all("worker" in line and "pod" in line for line in connected)
    asked = [
        line
        for line in lines
        if line.get("event") == "http.request" and line.get("session_id") == session
    ]
    assert asked and asked[0]["route"] == "/v1/sessions/{session_id}"
    assert asked[0]["status"] == 200 and isinstance(asked[0]["duration_ms"], float)


def test_an_ingest_only_process_serves_probes_and_metrics_but_no_api(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "kvsi.log"
    with kvsi(log, "serve", "--demo", "--no-api", "--metrics-port", str(port)) as proc:

        def ingesting() -> bool:
            applied = samples(get(f"{base}/metrics")[1]).get("kvsi_batches_total", [])
            workers = {labels["worker"] for labels, value in applied if value > 0}
            return len(workers) == 3

        wait_until(ingesting, "three workers ingesting", proc)
        ((build, _),) = samples(get(f"{base}/metrics")[1])["kvsi_build_info"]
        assert build["core"] == "native", build
        assert get(f"{base}/healthz")[0] == 200
        status, body = get(f"{base}/readyz")
        assert status == 200, body
        assert get(f"{base}/v1/pods")[0] == 404, "no index API on the probe port"
    output = log.read_text()
    assert "serving on" not in output
    assert any(line.get("event") == "serve.probes" for line in logs(output))


def test_the_dashboard_is_importable_grafana_json() -> None:
    board = json.loads(Path(DASHBOARD).read_text())
    assert board["uid"] == "kv-session-index" and board["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    source, *variables = board["templating"]["list"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    assert [v["name"] for v in variables] == ["namespace", "job", "worker"]
    for variable in variables:
        assert variable["datasource"]["uid"] == "${datasource}" and variable["includeAll"]
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}"


def test_every_query_follows_the_namespace_job_and_worker_variables() -> None:
    board = json.loads(Path(DASHBOARD).read_text())
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            for selector in re.findall(r"\bkvsi_[a-z0-9_]+(\{[^}]*\})?", target["expr"]):
                assert 'namespace=~"$namespace"' in selector, (panel["title"], target["expr"])
                assert 'job=~"$job"' in selector, (panel["title"], target["expr"])
            if "by (worker)" in target["expr"]:
                assert 'worker=~"$worker"' in target["expr"], panel["title"]
    queries = [v["query"]["query"] for v in board["templating"]["list"][1:]]
    assert queries[1].count("$namespace") == 1 and queries[2].count("$job") == 1, "cascading"


def test_a_panel_shows_each_workers_state() -> None:
    board = json.loads(Path(DASHBOARD).read_text())
    (panel,) = [p for p in board["panels"] if p["title"] == "Worker state"]
    assert panel["type"] == "state-timeline"
    (target,) = panel["targets"]
    assert target["legendFormat"] == "{{worker}}"
    assert "kvsi_worker_degraded" in target["expr"] and "kvsi_publisher_connected" in target["expr"]
    (mapping,) = panel["fieldConfig"]["defaults"]["mappings"]
    texts = {value: shown["text"] for value, shown in mapping["options"].items()}
    assert texts == {
        "0": "live",
        "1": "disconnected",
        "2": "degraded",
        "3": "degraded, disconnected",
    }


def test_the_dashboard_ships_as_a_config_map_for_grafanas_sidecar() -> None:
    objs = rendered("external-redis")
    (config_map,) = [
        o
        for o in objs
        if o["kind"] == "ConfigMap" and o["metadata"].get("labels", {}).get("grafana_dashboard")
    ]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["name"] == "kvsi-grafana-dashboard", "no hash suffix"
    (text,) = config_map["data"].values()
    assert json.loads(text) == json.loads(DASHBOARD.read_text())
    assert len(text.encode()) < 256 * 1024, "kubectl apply's last-applied annotation limit"
