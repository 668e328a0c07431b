"""A Kubernetes API server for pods only, on loopback: list, and watch as JSON lines.

Speaks what lightkube (and kubectl) expect of `GET /api/v1/namespaces/NS/pods`: a PodList
with `metadata.resourceVersion`, or with `watch=true` a chunked stream of
`{"type": ..., "object": Pod}` lines from the requested version on. Tests change pods with
`put`/`delete` (every open watch sees it), drop an event on purpose (`delete(...,
notify=False)`), or expire every watch with a 410 ERROR event (a compacted version), and
read `requests` to see what the client asked.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

Json = dict[str, Any]

_END = {"type": "END"}
"""Closes a watch stream (not sent to the client)."""


def pod(
    name: str,
    *,
    ip: str | None = "127.0.0.1",
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    namespace: str = "llm",
) -> Json:
    """A Pod as the API server serializes it (the fields discovery reads, and some more)."""
    status: Json = {"phase": phase, "hostIP": "10.1.0.4", "qosClass": "Burstable"}
    if ip is not None:
        status |= {"podIP": ip, "podIPs": [{"ip": ip}]}
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "labels": labels or {"app.kubernetes.io/name": "vllm"},
            "annotations": annotations or {},
        },
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0"}]},
        "status": status,
    }


class FakeKube:
    """Pods, their resource versions, and the open watches."""

    def __init__(self, namespace: str = "llm") -> None:
        self.namespace = namespace
        self.version = 100
        self.pods: dict[str, Json] = {}
        self.requests: list[dict[str, str]] = []
        self._watches: list[asyncio.Queue[Json]] = []
        self.recorded: list[Json] | None = None
        """Lines a watch serves instead of live changes (a recorded stream), then ends."""
        app = Starlette(
            routes=[Route("/api/v1/namespaces/{namespace}/pods", self._pods, methods=["GET"])]
        )
        self._server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None, lifespan="off")
        )
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    async def __aenter__(self) -> FakeKube:
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:  # uvicorn offers no started event to await
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        host, port = self._server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.expire_watches(send_error=False)
        self._server.should_exit = True
        if self._task is not None:
            await self._task

    def kubeconfig(self) -> str:
        """A kubeconfig naming this server, for KUBECONFIG."""
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "users": [{"name": "nobody", "user": {}}],
                "contexts": [
                    {
                        "name": "fake",
                        "context": {"cluster": "fake", "user": "nobody", "namespace": "llm"},
                    }
                ],
                "current-context": "fake",
            }
        )

    # -- changes ---------------------------------------------------------------------------

    def put(self, obj: Json) -> None:
        """Create or update a pod; open watches get ADDED or MODIFIED."""
        name = obj["metadata"]["name"]
        kind = "MODIFIED" if name in self.pods else "ADDED"
        self.pods[name] = self._stamped(obj)
        self._send({"type": kind, "object": self.pods[name]})

    def delete(self, name: str, *, notify: bool = True) -> None:
        """Delete a pod; `notify=False` loses the DELETED event (a watch that was down)."""
        gone = self._stamped(self.pods.pop(name))
        if notify:
            self._send({"type": "DELETED", "object": gone})

    def expire_watches(self, *, send_error: bool = True) -> None:
        """End every open watch, first with a 410 ERROR event: their version is too old."""
        for queue in self._watches:
            if send_error:
                queue.put_nowait(
                    {
                        "type": "ERROR",
                        "object": {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "metadata": {},
                            "status": "Failure",
                            "message": "too old resource version: 1 (100)",
                            "reason": "Expired",
                            "code": 410,
                        },
                    }
                )
            queue.put_nowait(_END)

    @property
    def watching(self) -> int:
        return len(self._watches)

    def _stamped(self, obj: Json) -> Json:
        self.version += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.version)
        return obj

    def _send(self, event: Json) -> None:
        for queue in self._watches:
            queue.put_nowait(event)

    # -- the API ---------------------------------------------------------------------------

    async def _pods(self, request: Request) -> Response:
        params = dict(request.query_params)
        self.requests.append(params)
        if request.path_params["namespace"] != self.namespace:
            return JSONResponse({"kind": "PodList", "apiVersion": "v1", "items": []})
        wanted = _selector(params.get("labelSelector", ""))
        if params.get("watch") == "true":
            return StreamingResponse(self._stream(wanted), media_type="application/json")
        items = [p for p in self.pods.values() if _matches(p, wanted)]
        return JSONResponse(
            {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }
        )

    async def _stream(self, wanted: dict[str, str]) -> AsyncIterator[bytes]:
        if self.recorded is not None:
            for line in self.recorded:
                yield json.dumps(line).encode() + b"\n"
            return
        queue: asyncio.Queue[Json] = asyncio.Queue()
        self._watches.append(queue)
        try:
            while (event := await queue.get()) is not _END:
                if event["type"] == "ERROR" or _matches(event["object"], wanted):
                    yield json.dumps(event).encode() + b"\n"
        finally:
            self._watches.remove(queue)


def _selector(text: str) -> dict[str, str]:
    pairs = (part.split("=", 1) for part in text.split(",") if part)
    return {key: value for key, value in pairs}


def _matches(obj: Json, wanted: dict[str, str]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in wanted.items())
