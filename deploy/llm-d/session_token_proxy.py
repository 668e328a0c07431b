"""A reference proxy in front of an llm-d gateway: for a request that names its session, ask
kv-session-index where the session's KV cache is and set the header llm-d's endpoint picker
reads (`x-session-token`), then forward the request unchanged otherwise.

Needs only httpx, starlette and uvicorn (the kv-session-index image has them); imports
nothing of kvsi. It fails open: no session, an unknown one, no holder, kvsi slow or down:
the request goes on as it came (a client's own `x-session-token` is kept unless kvsi has a
hint). docs/routers/llm-d.md and docs/routers/proxy.md say where it sits.

    python session_token_proxy.py --listen 0.0.0.0:8080 \\
        --upstream http://inference-gateway.llm.svc --kvsi http://kvsi-api.llm.svc:8000
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

log = logging.getLogger("session_token_proxy")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
"""Headers that describe one connection, not the request: never forwarded as they came."""

MAX_BODY_SCAN = 1 << 20
"""Bodies up to 1 MiB are read for a `session_id` field when no session header is given."""

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@dataclass(frozen=True)
class ProxyConfig:
    """Where to forward, whom to ask, how."""

    upstream: str
    kvsi: str
    form: str = "llm-d"
    session_header: str = "x-session-id"
    token: str | None = None
    timeout: float = 0.1
    pod_url: str | None = None
    """`http://{pod}.vllm.llm.svc:8000`: send a hinted request straight to its pod (a plain
    proxy without llm-d); None: always to `upstream`, which picks with the header."""


@dataclass(frozen=True)
class Hint:
    """What kvsi said: the headers to set and the pod they name (None: no hint)."""

    headers: dict[str, str]
    pod: str | None


NO_HINT = Hint({}, None)


def create_proxy(config: ProxyConfig) -> Starlette:
    """The proxy as an ASGI app; its HTTP clients live as long as the app runs."""
    clients: dict[str, httpx.AsyncClient] = {}

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        auth = {"Authorization": f"Bearer {config.token}"} if config.token else {}
        clients["kvsi"] = httpx.AsyncClient(
            base_url=config.kvsi, headers=auth, timeout=config.timeout
        )
        # LLM answers stream for minutes: bound the connect, never the read.
        clients["upstream"] = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=5.0))
        try:
            yield
        finally:
            for client in clients.values():
                await client.aclose()

    async def forward(request: Request) -> Response:
        body = await request.body()
        session = _session_of(request, body, config.session_header)
        hint = NO_HINT if session is None else await _hint(clients["kvsi"], session, config.form)
        base = config.upstream
        if config.pod_url is not None and hint.pod is not None:
            base = config.pod_url.format(pod=hint.pod)
        upstream = clients["upstream"]
        outgoing = upstream.build_request(
            request.method,
            base.rstrip("/") + _raw_path(request),
            params=request.url.query,
            headers=[*_kept(request.headers.items(), drop=hint.headers), *hint.headers.items()],
            content=body,
        )
        try:
            answer = await upstream.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            return Response(f"upstream unreachable: {type(exc).__name__}\n", status_code=502)
        response = StreamingResponse(
            answer.aiter_raw(),
            status_code=answer.status_code,
            background=BackgroundTask(answer.aclose),
        )
        kept = _kept(answer.headers.multi_items(), drop=())
        response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in kept]
        return response

    routes = [Route("/{path:path}", forward, methods=METHODS)]
    return Starlette(routes=routes, lifespan=lifespan)


def _raw_path(request: Request) -> str:
    """The path as the client sent it: percent-escapes kept (`/v1/models/org%2Fname`)."""
    raw = request.scope.get("raw_path")
    return raw.decode("latin-1") if isinstance(raw, bytes) else request.url.path


def _kept(headers: Iterable[tuple[str, str]], drop: Iterable[str]) -> list[tuple[str, str]]:
    """Every header but the per-connection ones and those in `drop`, repeats kept."""
    gone = HOP_BY_HOP | set(drop)
    return [(k, v) for k, v in headers if k.lower() not in gone]


def _session_of(request: Request, body: bytes, header: str) -> str | None:
    """The session header, else a JSON body's top-level `session_id` (vLLM's field)."""
    named = request.headers.get(header)
    if named:
        return named
    if len(body) > MAX_BODY_SCAN or "json" not in request.headers.get("content-type", ""):
        return None
    try:
        field = json.loads(body).get("session_id")
    except (ValueError, AttributeError):
        return None
    return field if isinstance(field, str) and field else None


async def _hint(kvsi: httpx.AsyncClient, session: str, form: str) -> Hint:
    """kvsi's hint for the session; none when it has none or cannot answer in time."""
    path = f"/v1/sessions/{quote(session, safe='')}/hint"
    try:
        answer = await kvsi.get(path, params={"format": form})
    except httpx.HTTPError as exc:
        log.warning("kvsi unreachable, forwarding without a hint: %s", type(exc).__name__)
        return NO_HINT
    if answer.status_code != 200:
        log.debug("no hint for session %r: HTTP %d", session, answer.status_code)
        return NO_HINT
    found = answer.json()
    headers = {str(k): str(v) for k, v in found.get("headers", {}).items()}
    pod = found.get("pod")
    return Hint(headers, pod if isinstance(pod, str) else None)


def _config(argv: list[str] | None = None) -> tuple[ProxyConfig, str, int]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:8080", help="HOST:PORT to serve on")
    parser.add_argument("--upstream", required=True, help="the llm-d gateway's URL")
    parser.add_argument("--kvsi", required=True, help="kv-session-index's URL")
    parser.add_argument("--format", default="llm-d", choices=["llm-d", "label"])
    parser.add_argument("--session-header", default="x-session-id")
    parser.add_argument("--token-file", type=Path, help="a file holding kvsi's bearer token")
    parser.add_argument("--timeout", type=float, default=0.1, help="seconds to wait for kvsi")
    parser.add_argument(
        "--pod-url", help="send hinted requests to this pod URL, e.g. http://{pod}.vllm:8000"
    )
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    token = args.token_file.read_text().strip() if args.token_file else None
    config = ProxyConfig(
        upstream=args.upstream,
        kvsi=args.kvsi,
        form=args.format,
        session_header=args.session_header.lower(),
        token=token,
        timeout=args.timeout,
        pod_url=args.pod_url,
    )
    return config, host, int(port)


def main(argv: list[str] | None = None) -> None:
    config, host, port = _config(argv)
    logging.basicConfig(level=logging.INFO)
    uvicorn.run(create_proxy(config), host=host, port=port, log_level="info")


if __name__ == "__main__":
    main()
