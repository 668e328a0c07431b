"""The docs' shell examples, pasted into a shell against a running `kvsi serve --demo`.

Every fenced `bash`/`sh` block of README.md, deploy/README.md and docs/ is read; the lines
that talk to a running service (`curl`, `kvsi tail`) run in bash as written, with only
these changes, the ones a reader makes too:

- the service's address: `localhost:8000` and `kvsi-api.llm.svc:8000` become the demo's,
  `localhost:8090` its Dynamo port, `127.0.0.1:5557` its first pod's publisher;
- the example session `sess-00182` becomes a session the demo holds, the example pods
  `vllm-7d9c4f-x2x8q` / `vllm-7d9c4f-k5n2p` its `pod-a` / `pod-b`;
- lines that start a service or need a cluster (`kvsi serve`, `make demo`, `kubectl`,
  `docker`, `vllm serve`, the proxy) are left out: the test runs its own demo.

In a block with `$ ` prompts only the prompted lines are commands (the rest is output).
`curl` fails the example on an HTTP status of 400 or more.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.children import tied
from tests.environ import service_environ
from tests.paths import ROOT
from tests.ports import free_port_run
from tests.waiting import until_sync

pytestmark = pytest.mark.e2e

DOCS = [ROOT / "README.md", ROOT / "deploy" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

NOT_RUN = ("kvsi serve", "make demo", "kubectl ", "docker ", "vllm serve", "python deploy/")
"""Commands that start a service or need a cluster: the test's demo stands in for them."""

ENV_PREFIX = re.compile(r"^(\w+=\S*\s+)+")
"""`NAME=value ...` before a command: the environment it runs with."""

TALKS_TO_SERVICE = re.compile(r"(^|\s)(curl|\S*kvsi tail)\s")

CURL_CHECKS_STATUS = r"""
curl() {
  local out code
  out=$(command curl --show-error -w '\n%{http_code}' "$@") || return $?
  code=${out##*$'\n'}
  printf '%s\n' "${out%$'\n'*}"
  if [ "$code" -ge 400 ]; then echo "HTTP $code from: curl $*" >&2; return 22; fi
}
"""

FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Example:
    where: str
    script: str


def examples() -> list[Example]:
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for block in FENCE.finditer(text):
            if block["lang"] not in ("bash", "sh"):
                continue
            script = "\n".join(commands(block["body"]))
            if TALKS_TO_SERVICE.search(script):
                line = text[: block.start()].count("\n") + 1
                found.append(Example(f"{doc.relative_to(ROOT)}:{line}", script))
    return found


def commands(body: str) -> Iterator[str]:
    """The block's commands (`$ `-prompted lines only, if it has any), each with its
    continuation lines (a trailing backslash, a single-quoted string left open), leaving
    out those NOT_RUN."""
    lines = body.splitlines()
    prompted = any(line.startswith("$ ") for line in lines)
    current: list[str] = []
    for line in lines:
        if not current:
            if prompted and not line.startswith("$ "):
                continue
            line = line.removeprefix("$ ")
        current.append(line)
        text = "\n".join(current)
        if text.rstrip().endswith("\\") or text.count("'") % 2:
            continue
        if not ENV_PREFIX.sub("", text).startswith(NOT_RUN):
            yield text
        current = []


@dataclass(frozen=True)
class Demo:
    url: str
    dynamo: str
    publisher: str
    session: str


def held_session(url: str) -> str:
    with urllib.request.urlopen(f"{url}/v1/sessions?order=blocks&limit=1", timeout=5) as r:
        sessions = json.loads(r.read())["sessions"]
    return str(sessions[0]["session_id"]) if sessions else ""


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    base, dynamo = free_port_run(6), free_port_run(1)
    env = service_environ(
        {
            "KVSI_DEMO_BASE_PORT": str(base),
            "KVSI_DYNAMO_API": "true",
            "KVSI_DYNAMO__PORT": str(dynamo),
            "PYTHONUNBUFFERED": "1",
        }
    )
    log = tmp_path_factory.mktemp("demo") / "kvsi.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            tied([sys.executable, "-m", "kvsi", "serve", "--demo", "--port", "0"]),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:

        def serving() -> str | None:
            assert proc.poll() is None, log.read_text()[-2000:]
            found = re.search(r"serving on (http://\S+)", log.read_text())
            return found.group(1) if found else None

        url = until_sync(serving, 45, "the demo serving")
        session = until_sync(lambda: held_session(url), 30, "the demo holding a session")
        yield Demo(url, f"http://127.0.0.1:{dynamo}", f"127.0.0.1:{base}", session)
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def adapted(script: str, demo: Demo) -> str:
    host = demo.url.removeprefix("http://")
    for example, real in (
        ("localhost:8000", host),
        ("kvsi-api.llm.svc:8000", host),
        ("localhost:8090", demo.dynamo.removeprefix("http://")),
        ("127.0.0.1:5557", demo.publisher),
        ("sess-00182", demo.session),
        ("vllm-7d9c4f-x2x8q", "pod-a"),
        ("vllm-7d9c4f-k5n2p", "pod-b"),
    ):
        script = script.replace(example, real)
    return script


def test_the_docs_have_examples_to_run() -> None:
    where = {example.where.split(":")[0] for example in examples()}
    assert {"README.md", "deploy/README.md", "docs/routers/llm-d.md"} <= where, where
    assert len(examples()) >= 8, [e.where for e in examples()]


@pytest.mark.parametrize("example", examples(), ids=lambda e: e.where)
def test_a_docs_example_runs_as_written(example: Example, demo: Demo) -> None:
    env = service_environ({"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", CURL_CHECKS_STATUS + adapted(example.script, demo)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
    )
    shown = f"{example.where}\n{example.script}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, shown
    assert result.stdout.strip(), shown
