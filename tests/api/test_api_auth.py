"""Bearer tokens guard every /v1 endpoint; probes stay open; metrics on request."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsi.api import create_app
from kvsi.errors import StartupError
from kvsi.settings import bearer_tokens, load_settings
from kvsi.store.memory import MemoryStore
from tests.api.harness import client_for

V1 = ["/v1/pods", "/v1/sessions", "/v1/sessions/s1", "/v1/pods/pod-a/blocks"]


@pytest.mark.parametrize("path", V1)
async def test_v1_needs_a_token_when_tokens_are_set(path: str) -> None:
    async with client_for(create_app(MemoryStore(), tokens=["t0k3n", "other"])) as client:
        missing = await client.get(path)
        wrong = await client.get(path, headers={"Authorization": "Bearer nope"})
        right = await client.get(path, headers={"Authorization": "Bearer other"})
    assert missing.status_code == 401
    assert "missing bearer token" in missing.json()["detail"]
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert wrong.status_code == 401 and wrong.json()["detail"] == "invalid bearer token"
    assert right.status_code != 401


async def test_probes_and_metrics_stay_open_unless_metrics_are_protected() -> None:
    async with client_for(create_app(MemoryStore(), tokens=["t"])) as client:
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await client.get(path)).status_code == 200, path
    app = create_app(MemoryStore(), tokens=["t"], metrics_require_token=True)
    async with client_for(app) as client:
        assert (await client.get("/metrics")).status_code == 401
        ok = await client.get("/metrics", headers={"Authorization": "Bearer t"})
        assert ok.status_code == 200
        assert (await client.get("/healthz")).status_code == 200


async def test_no_tokens_means_open() -> None:
    async with client_for(create_app(MemoryStore())) as client:
        assert (await client.get("/v1/pods")).status_code == 200


async def test_openapi_documents_the_bearer_scheme() -> None:
    async with client_for(create_app(MemoryStore(), tokens=["t"])) as client:
        spec = (await client.get("/openapi.json")).json()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert spec["paths"]["/v1/pods"]["get"]["security"] == [{"HTTPBearer": []}]


def test_tokens_come_from_the_setting_and_the_file(tmp_path: Path) -> None:
    secret = tmp_path / "tokens"
    secret.write_text("# rotated 2026-11\nfrom-file\n\n  spaced  \n")
    settings = load_settings(None, api_tokens=["inline"], api_tokens_file=secret)
    assert bearer_tokens(settings) == ["inline", "from-file", "spaced"]


def test_a_required_token_refuses_an_empty_tokens_file(tmp_path: Path) -> None:
    secret = tmp_path / "tokens"
    secret.write_text("# no token yet\n\n")
    with pytest.raises(StartupError, match="api_require_token"):
        load_settings(None, api_tokens_file=secret, api_require_token=True)
    secret.write_text("t0k3n\n")
    settings = load_settings(None, api_tokens_file=secret, api_require_token=True)
    assert bearer_tokens(settings) == ["t0k3n"]
    ingest_only = load_settings(None, api=False, api_require_token=True)
    assert bearer_tokens(ingest_only) == [], "an ingest-only process serves no API"
