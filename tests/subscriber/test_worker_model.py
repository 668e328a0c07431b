"""A worker's model: named by the publisher's topic `kv@<pod>@<model>` (live frames, or the
configured filter), unless configured; stored with the worker's status."""

from __future__ import annotations

import pytest
import zmq
import zmq.asyncio

from kvsi.store.memory import MemoryStore
from kvsi.subscriber.gate import StoreGate
from kvsi.subscriber.stream import PublisherSpec, WorkerStream
from kvsi.subscriber.topic import model_of_topic
from tests.subscriber.conftest import FAST, RigFactory
from tests.subscriber.peers import Publisher, payload, running, stored, tcp
from tests.waiting import eventually


@pytest.mark.parametrize(
    ("topic", "model"),
    [
        ("kv@pod-a@meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B"),
        (b"kv@pod-a@m@v2", "m@v2"),
        ("kv@pod-a@", None),
        ("kv@", None),
        ("kv@@m", None),
        ("", None),
        ("events@pod-a@m", None),
        (b"kv@pod-a@\xff", None),
        ("kv@pod-a@" + "m" * 257, None),
    ],
)
def test_model_of_topic(topic: str | bytes, model: str | None) -> None:
    assert model_of_topic(topic) == model


async def test_the_topic_of_live_messages_names_the_workers_model(rig: RigFactory) -> None:
    r = await rig()  # its publisher's topic is kv@pod-a@m
    await r.publisher.send(payload([stored([1])]))
    await r.applied_through(0)

    async def named() -> bool:
        return (await r.view()).model == "m"

    await eventually(named)

    r.publisher.topic = b"kv@pod-a@m2"  # the engine came back serving another model
    await r.publisher.send(payload([stored([2])]))

    async def renamed() -> bool:
        return (await r.view()).model == "m2"

    await eventually(renamed)


@pytest.mark.parametrize(
    ("spec_topic", "model", "expected"),
    [("", "configured", "configured"), ("kv@pod-a@filtered", None, "filtered")],
)
async def test_the_configuration_names_the_model_before_any_message(
    ctx: zmq.asyncio.Context, spec_topic: str, model: str | None, expected: str
) -> None:
    publisher = Publisher(ctx, tcp(), topic=b"kv@pod-a@filtered")
    endpoint = publisher.sock.getsockopt_string(zmq.LAST_ENDPOINT)
    spec = PublisherSpec("pod-a", endpoint, topic=spec_topic, model=model)
    store = MemoryStore()
    stream = WorkerStream(spec, StoreGate(store), ctx, options=FAST)
    try:
        async with running(stream):
            await stream.health.until_stored()
            [before] = await store.list_workers()
            await publisher.probe(stream)
            await publisher.send(payload([stored([1])]))

            async def applied() -> bool:
                return await store.fence(stream.worker) is not None

            await eventually(applied)
            await stream.health.until_stored()
            [after] = await store.list_workers()
    finally:
        publisher.close()

    assert (before.model, after.model) == (expected, expected)
