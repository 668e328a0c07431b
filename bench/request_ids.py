"""What does following a request cost: the `X-Request-ID` middleware (kvsi/api/observe.py)
around an ASGI app that answers at once, per request, with the id made and with it taken?

Run: `.venv/bin/python bench/request_ids.py [--requests 100000]` (see bench/README.md). One
process, no sockets: the app is called as uvicorn calls it, so the difference is the
middleware's own CPU (the id, the log context bound and unbound, the echoed header).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvsi.api.observe import RequestIds


async def answer(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


async def receive() -> Message:
    return {"type": "http.request", "body": b""}


async def discard(message: Message) -> None:
    return None


async def per_request(app: ASGIApp, requests: int, given: bool) -> float:
    """Microseconds per request."""
    headers = [(b"host", b"kvsi")] + ([(b"x-request-id", b"router-7f3a-0001")] if given else [])
    started = time.perf_counter()
    for _ in range(requests):
        scope = {"type": "http", "method": "GET", "path": "/v1/pods", "headers": headers}
        await app(scope, receive, discard)
    return (time.perf_counter() - started) / requests * 1e6


async def main(requests: int) -> None:
    wrapped = RequestIds(answer)
    for run in ("warm-up", "measured"):
        bare = await per_request(answer, requests, False)
        made = await per_request(wrapped, requests, False)
        taken = await per_request(wrapped, requests, True)
        print(
            f"{run}: bare {bare:.2f} us; id made {made:.2f} us (+{made - bare:.2f}); "
            f"id taken {taken:.2f} us (+{taken - bare:.2f})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=100_000)
    asyncio.run(main(parser.parse_args().requests))
