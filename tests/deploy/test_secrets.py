"""Secrets: in every overlay the store's URL (it may carry a password) and the API's tokens
come from the Secret `kvsi`, never from the ConfigMap; the shipped overlays' API refuses to
start without a token; only the dev overlay makes its Secret and opens the API, explicitly."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvsi.settings import bearer_tokens
from tests.deploy import manifests
from tests.deploy.cli_check import run_kvsi
from tests.deploy.manifests import (
    OVERLAYS,
    SHIPPED,
    config_map,
    containers,
    expanded,
    is_kvsi,
    materialized,
    rendered,
    secret_files,
)


def api_tokens(overlay: str, files: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tokens the overlay's API container would accept, read as the service reads them."""
    objs = rendered(overlay)
    ((workload, container),) = [
        (w, c) for w, c in containers(objs) if w["metadata"]["name"] == "kvsi-api"
    ]
    env = materialized(objs, workload, container, files)
    kvsi_env = {k: v for k, v in env.items() if k.startswith("KVSI_")}
    parsed = run_kvsi(expanded(container["args"], env), kvsi_env, monkeypatch)
    assert parsed.settings is not None
    return bearer_tokens(parsed.settings)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_kvsi_container_takes_the_store_url_from_the_secret(overlay: str) -> None:
    objs = rendered(overlay)
    assert "KVSI_STORE" not in config_map(objs), "a password does not belong in a ConfigMap"
    kvsi = [c for _, c in containers(objs) if is_kvsi(c)]
    assert len(kvsi) == 2, "the API and the ingest process"
    for container in kvsi:
        (store,) = [v for v in container["env"] if v["name"] == "KVSI_STORE"]
        ref = store["valueFrom"]["secretKeyRef"]
        assert ref["name"].startswith("kvsi") and ref["key"] == "store", container["name"]


@pytest.mark.parametrize("overlay", SHIPPED)
def test_the_shipped_overlays_api_requires_a_token_from_the_secret(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = rendered(overlay)
    assert not [o for o in objs if o["kind"] == "Secret"], "the operator creates the Secret"
    assert api_tokens(overlay, tmp_path, monkeypatch) == ["sample-token"]
    ((workload, api),) = [
        (w, c) for w, c in containers(objs) if w["metadata"]["name"] == "kvsi-api"
    ]
    (tokens_file,) = secret_files(objs, workload, api)
    (variable,) = [v for v in api["env"] if v["name"] == "KVSI_API_TOKENS_FILE"]
    assert variable["value"] == tokens_file


@pytest.mark.parametrize("overlay", SHIPPED)
def test_a_shipped_api_without_a_token_refuses_to_start(
    overlay: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manifests, "SAMPLE_TOKENS", "# none yet\n")
    with pytest.raises(AssertionError, match="kvsi: error: api_require_token is set"):
        api_tokens(overlay, tmp_path, monkeypatch)  # the CLI's own refusal, exit 2


def test_the_dev_overlay_opens_the_api_explicitly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objs = rendered("dev")
    (made,) = [o for o in objs if o["kind"] == "Secret"]
    assert made["metadata"]["name"].startswith("kvsi-")
    assert api_tokens("dev", tmp_path, monkeypatch) == [], "no token: an open API"
