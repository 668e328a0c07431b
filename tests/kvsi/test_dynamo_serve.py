"""`kvsi serve` with the Dynamo API on, over real HTTP: a Dynamo client registers an engine
on Dynamo's port, kvsi subscribes to it, and the same overlap answers on that port and under
the main port's prefix, with the worker's model and Dynamo headers in the REST API."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import httpx
import zmq
import zmq.asyncio

from kvsi.hashing.dynamo import tokens_hashes
from kvsi.serve import run_service
from kvsi.settings import Settings
from kvsi.store.model import canonical_hash
from tests.ports import free_port_run
from tests.subscriber.peers import Publisher, payload, stored, tcp
from tests.waiting import eventually

HASHES = [2**64 - 1, 5]


async def test_a_dynamo_client_registers_and_queries_on_its_own_port_and_the_prefix() -> None:
    ctx = zmq.asyncio.Context()
    publisher = Publisher(ctx, tcp(), topic=b"")
    dynamo_port = free_port_run(1)
    settings = Settings(
        port=0,
        dynamo_api=True,
        dynamo={"port": dynamo_port, "follow_seconds": 0.05},
    )
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    service = asyncio.create_task(run_service(settings, on_ready=ready.set_result))
    try:
        main = await asyncio.wait_for(ready, 30)
        async with (
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{dynamo_port}") as dynamo,
            httpx.AsyncClient(base_url=main) as rest,
        ):

            async def serving() -> bool:
                try:
                    return (await dynamo.get("/health")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(serving)
            endpoint = publisher.sock.getsockopt_string(zmq.LAST_ENDPOINT)
            body = {"instance_id": 7, "endpoint": endpoint, "model_name": "m", "block_size": 4}
            assert (await dynamo.post("/register", json=body)).status_code == 201

            # Dynamo's hashes of the blocks' tokens (`stored` sends 16 zeros per block).
            dynamo_hashes = tokens_hashes([0] * 16 * len(HASHES), 16)
            signed = [h - 2**64 if h >= 2**63 else h for h in dynamo_hashes]
            query = {"block_hashes": signed, "model_name": "m"}

            batch = payload([stored(HASHES)])

            async def scored() -> bool:
                await publisher.send(batch, seq=0)  # again until subscribed: a duplicate after
                answer = (await dynamo.post("/query_by_hash", json=query)).json()
                return bool(answer["scores"] == {"7": {"0": 8}})

            await eventually(scored, within=20)
            prefixed = await rest.post("/dynamo/query_by_hash", json=query)
            pods = (await rest.get("/v1/pods")).json()["pods"]
            route = {"block_hashes": [str(canonical_hash(h)) for h in HASHES], "model": "m"}
            ranked = (await rest.post("/v1/route", json=route)).json()["ranking"]

        assert prefixed.json()["instances"]["7"]["longest_matched"] == 8
        assert [(p["pod"], p["model"]) for p in pods] == [("dynamo-7", "m")]
        assert ranked[0]["dynamo_headers"] == {"x-worker-instance-id": "7", "x-dp-rank": "0"}
    finally:
        service.cancel()
        await asyncio.gather(service, return_exceptions=True)
        publisher.close()
        ctx.destroy(linger=0)


def test_a_dynamo_port_in_use_stops_the_whole_service() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = os.environ | {
            "KVSI_PORT": "0",
            "KVSI_DYNAMO_API": "true",
            "KVSI_DYNAMO__PORT": str(taken.getsockname()[1]),
        }
        result = subprocess.run(
            [sys.executable, "-m", "kvsi", "serve"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )

    assert result.returncode == 2
    assert "kvsi: error: cannot listen on" in result.stderr
    assert "address already in use" in result.stderr.lower()
    assert "Traceback" not in result.stderr
