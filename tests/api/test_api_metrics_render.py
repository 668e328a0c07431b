"""`GET /metrics` at fleet size: the registry is collected on the event loop and the text
rendered in a thread, and the index's per-worker families are built once per refresh, not
per scrape (rendered on the loop, thousands of per-worker samples held every request)."""

from __future__ import annotations

import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, Metric, generate_latest

from kvsi import metrics as service_metrics
from kvsi.api import create_app
from kvsi.api.routes import metrics as metrics_route
from kvsi.api.routes.metrics import Collected
from kvsi.metrics import IndexSizes
from kvsi.store.memory import MemoryStore
from tests.api.harness import client_for

WORKERS = 1_000


async def test_the_text_is_rendered_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    index = service_metrics.INDEX
    monkeypatch.setattr(index, "_families", index._families)  # the global, as it was after
    index.update([(f"pod-{i}/0", i, 10 * i) for i in range(WORKERS)])
    rendered_on: list[int] = []
    render = metrics_route.generate_latest

    def recording(registry: object) -> bytes:
        rendered_on.append(threading.get_ident())
        return render(registry)  # type: ignore[arg-type]

    monkeypatch.setattr(metrics_route, "generate_latest", recording)

    async with client_for(create_app(MemoryStore())) as client:
        response = await client.get("/metrics")

    assert response.status_code == 200
    assert len(rendered_on) == 1 and rendered_on[0] != threading.get_ident()
    assert f"kvsi_index_workers {float(WORKERS)}" in response.text
    assert f'kvsi_index_entries{{worker="pod-{WORKERS - 1}/0"}} {10.0 * (WORKERS - 1)}' in (
        response.text
    )
    assert "kvsi_http_request" in response.text


def _names(metrics: list[Metric]) -> list[str]:
    return [m.name for m in metrics]


def test_the_index_families_are_built_once_per_refresh() -> None:
    sizes = IndexSizes()
    assert list(sizes.collect()) == [], "nothing before the first refresh"

    sizes.update([("pod-0/0", 2, 20)], [("pod-0/0", 1, 3, 48)])
    first, again = list(sizes.collect()), list(sizes.collect())

    assert all(a is b for a, b in zip(first, again, strict=True)), "the same families"
    assert _names(first) == [
        "kvsi_index_workers",
        "kvsi_index_sessions",
        "kvsi_index_entries",
        "kvsi_index_sessions_hurt",
        "kvsi_index_lost_blocks",
        "kvsi_index_reprefill_tokens",
    ]
    sizes.update([])
    assert [s.value for s in next(iter(sizes.collect())).samples] == [0.0]


def test_what_was_collected_renders_as_the_registry_does() -> None:
    registry = CollectorRegistry()
    sizes = IndexSizes()
    registry.register(sizes)
    sizes.update([(f"pod-{i}/0", i, 10 * i) for i in range(50)], [("pod-0/0", 1, 3, 48)])
    Counter("kvsi_test_total", "A counter.", ["worker"], registry=registry).labels("a").inc(3)
    Histogram("kvsi_test_seconds", "A histogram.", registry=registry).observe(0.25)

    assert generate_latest(Collected(list(registry.collect()))) == generate_latest(registry)
