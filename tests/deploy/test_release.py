"""A release you can pin: the version is written once (pyproject.toml), `kvsi --version` prints
it and every kvsi image in deploy/ is tagged with it; the licence, the changelog and the
type marker ship; the image and CI install the pinned dependency set of constraints.txt."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from kvsi.version import package_version
from tests.deploy.dockerfile import stages
from tests.deploy.manifests import OVERLAYS, containers, is_kvsi, kustomized, rendered
from tests.deploy.paths import DEPLOY, ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
RENDERINGS = [
    *(DEPLOY / "overlays" / name for name in OVERLAYS),
    *(ROOT / "tests" / "deploy" / "kustomize" / name for name in ("by-name", "dynamo")),
]


def normalized(requirement: str) -> str:
    """A requirement's distribution name as pip compares them (PEP 503)."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match is not None, requirement
    return re.sub(r"[-_.]+", "-", match.group()).lower()


def test_kvsi_version_prints_the_package_metadatas_version() -> None:
    assert package_version() == PROJECT["version"], "installed from this tree (pip install -e)"
    result = subprocess.run(
        [sys.executable, "-m", "kvsi", "--version"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"kvsi {PROJECT['version']} (native core)\n", "make native built it"


def test_the_build_compiles_with_the_pinned_mypy() -> None:
    """The wheel and the image build the native core with pyproject.toml's build pin, `make
    native` with the virtualenv's (constraints.txt): one mypyc for both."""
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    pinned = [r for r in build if normalized(r) == "mypy"]
    constraint = re.search(r"^mypy==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert constraint is not None and pinned == [f"mypy=={constraint.group(1)}"]


def test_every_kustomization_tags_the_kvsi_image_with_the_version() -> None:
    tags = {
        str(path.relative_to(DEPLOY)): image["newTag"]
        for path in DEPLOY.rglob("kustomization.yaml")
        for image in (yaml.safe_load(path.read_text()) or {}).get("images", [])
        if image["name"] == "kv-session-index"
    }
    assert len(tags) >= 5, "the base and each component with a kvsi container"
    assert set(tags.values()) == {package_version()}, tags


@pytest.mark.parametrize("where", RENDERINGS, ids=lambda p: p.name)
def test_every_rendered_kvsi_container_runs_the_versions_image(where: Path) -> None:
    objs = kustomized(where) if where.parent.name != "overlays" else rendered(where.name)
    images = {c["image"] for _, c in containers(objs) if is_kvsi(c)}
    for obj in objs:  # Dynamo's graph: the sidecar sits in the custom resource
        for service in obj.get("spec", {}).get("services", {}).values():
            images |= {c["image"] for c in service["extraPodSpec"].get("initContainers", [])}
    assert images == {f"kv-session-index:{package_version()}"}


def test_the_licence_the_changelog_and_the_type_marker_ship() -> None:
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    licence = (ROOT / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {PROJECT['version']} - " in changelog, "the released version has its section"
    assert (ROOT / "kvsi" / "py.typed").exists()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "py.typed" in data["package-data"]["kvsi"]


def test_constraints_pin_every_dependency_the_image_and_ci_install() -> None:
    pins = {
        normalized(line): line.split("==", 1)[1]
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if line and not line.startswith("#")
    }
    assert all(re.fullmatch(r"[\w.+!]+", version) for version in pins.values()), "exact pins"
    extras = PROJECT["optional-dependencies"]
    wanted = [
        *PROJECT["dependencies"],
        *(d for e in ("redis", "xxhash", "k8s", "otel", "dev") for d in extras[e]),
    ]
    assert {normalized(r) for r in wanted} - set(pins) == set()
    build = stages()[0]
    runs = build.all("RUN")
    assert any("-c constraints.txt" in run for run in runs), "the image installs the pins"
    makefile = (ROOT / "Makefile").read_text()
    assert 'pip install --quiet -c constraints.txt -e ".[dev]"' in makefile, "CI installs them"


def test_the_image_installs_dependencies_before_it_copies_the_source() -> None:
    build = stages()[0]
    order = [(key, args) for key, args in build.instructions if key in ("COPY", "RUN")]
    first_source = next(i for i, (k, a) in enumerate(order) if k == "COPY" and a == "kvsi kvsi")
    deps = next(i for i, (k, a) in enumerate(order) if k == "RUN" and "-r requirements.txt" in a)
    assert deps < first_source, "a code edit must not reinstall the dependencies"
    copied_before = [a for k, a in order[:deps] if k == "COPY"]
    assert copied_before == ["pyproject.toml constraints.txt ./"], "only what they depend on"
    assert "--without-pip" in build.all("RUN")[0], "no pip or setuptools in the runtime venv"
    assert re.search(r"uninstall -y rich pygments", build.last("RUN"))


def test_the_base_image_is_pinned_by_digest() -> None:
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base is not None
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?@sha256:[0-9a-f]{64}", base.group(1))
