"""Registration-driven ingest: an instance registered through the Dynamo API is subscribed
to (its events land under its worker, with its model), and forgotten once unregistered; a
registration naming a configured publisher's worker never doubles its stream."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from kvsi.dynamo_follow import follow_registrations
from kvsi.store.memory import MemoryStore
from kvsi.store.model import WorkerKey
from kvsi.store.registry import DynamoInstance
from kvsi.subscriber.pool import StreamPool
from kvsi.subscriber.stream import PublisherSpec
from tests.subscriber.peers import Publisher, payload, stored, tcp
from tests.waiting import eventually

FOLLOWED = WorkerKey("dynamo-7", 0)


class CountingStore(MemoryStore):
    """A memory store that counts the follower's rounds (its reads of the registrations)."""

    reads = 0

    async def instances(self) -> list[DynamoInstance]:
        self.reads += 1
        return await super().instances()


def registration(endpoint: str, *, pod: str = "dynamo-7", subscribe: bool = True) -> DynamoInstance:
    return DynamoInstance(7, 0, pod, "llama-3-8b", "default", 16, endpoint, subscribe=subscribe)


async def test_a_registered_instance_is_subscribed_then_forgotten_once_unregistered(
    ctx: zmq.asyncio.Context,
) -> None:
    publisher = Publisher(ctx, tcp(), topic=b"")
    store = MemoryStore()
    pool = StreamPool([], store)
    follower = asyncio.create_task(follow_registrations(store, pool, topic="", interval=0.02))
    try:
        await store.register_instance(
            registration(publisher.sock.getsockopt_string(zmq.LAST_ENDPOINT))
        )

        async def subscribed() -> bool:
            return len(pool.streams) == 1

        await eventually(subscribed)
        await publisher.probe(pool.streams[0])
        await publisher.send(payload([stored([1, 2])]))

        async def indexed() -> bool:
            views = {WorkerKey(w.pod, w.dp_rank): w for w in await store.list_workers()}
            view = views.get(FOLLOWED)
            return view is not None and view.blocks == 2 and view.model == "llama-3-8b"

        await eventually(indexed)

        await store.unregister_instance(7, None)

        async def forgotten() -> bool:
            return not pool.streams and await store.list_workers() == []

        await eventually(forgotten)
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await pool.stop()
        publisher.close()


async def test_a_registration_naming_a_configured_worker_adds_no_stream(
    ctx: zmq.asyncio.Context,
) -> None:
    endpoint = tcp()
    store = CountingStore()
    pool = StreamPool([PublisherSpec("vllm-0", endpoint)], store)
    await pool.start()
    follower = asyncio.create_task(follow_registrations(store, pool, topic="", interval=0.02))
    try:
        await store.register_instance(registration(endpoint, pod="vllm-0", subscribe=False))
        await store.register_instance(
            DynamoInstance(8, 0, "vllm-0", "llama-3-8b", "default", 16, endpoint)
        )  # asks to subscribe, but vllm-0/0 is already fed

        async def rounds() -> bool:
            return store.reads >= 3

        await eventually(rounds)

        assert [s.spec.pod for s in pool.streams] == ["vllm-0"]
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await pool.stop()
