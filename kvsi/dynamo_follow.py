"""Ingest's side of the Dynamo API: subscribe to the instances registered through it.

Imports the stream pool and the store contract; never the API (which only records the
registrations). Every `follow_seconds` this process reads them: a registration to subscribe
(`DynamoInstance.subscribe`) whose worker no stream here feeds gets a stream; a stream this
follower started whose registration is gone or changed is stopped and its worker forgotten,
as Dynamo's `/unregister` removes the instance from its index.
"""

from __future__ import annotations

import asyncio

import structlog

from kvsi.store.base import IndexReader
from kvsi.store.model import WorkerKey
from kvsi.store.registry import DynamoInstance
from kvsi.subscriber.pool import StreamPool
from kvsi.subscriber.stream import PublisherSpec

log = structlog.get_logger(__name__)


async def follow_registrations(
    store: IndexReader, pool: StreamPool, *, topic: str, interval: float
) -> None:
    """Keep the pool's followed streams as the registrations say, until cancelled."""
    followed: dict[WorkerKey, PublisherSpec] = {}
    while True:
        try:
            registered = await store.instances()
        except Exception as exc:  # an outage must not end the follower: the next round retries
            log.debug("dynamo.follow_skipped", error=f"{type(exc).__name__}: {exc}")
        else:
            await reconcile(pool, followed, wanted_streams(registered, topic))
        await asyncio.sleep(interval)


def wanted_streams(registered: list[DynamoInstance], topic: str) -> dict[WorkerKey, PublisherSpec]:
    """The stream each registration to subscribe asks for, by the worker it feeds."""
    return {
        i.worker: PublisherSpec(
            pod=i.pod,
            endpoint=i.endpoint,
            replay_endpoint=i.replay_endpoint,
            dp_rank=i.dp_rank,
            topic=topic,
            model=i.model_name,
        )
        for i in registered
        if i.subscribe
    }


async def reconcile(
    pool: StreamPool,
    followed: dict[WorkerKey, PublisherSpec],
    wanted: dict[WorkerKey, PublisherSpec],
) -> None:
    """Stop and forget what is followed but no longer wanted as it is; then start what is
    wanted and fed by no stream of the pool (a configured publisher is never doubled)."""
    for key, spec in list(followed.items()):
        if wanted.get(key) != spec:
            await pool.remove(key.pod, key.dp_rank)
            await pool.gate.remove_worker(key)
            del followed[key]
            log.info("dynamo.unfollowed", worker=str(key), endpoint=spec.endpoint)
    fed = {WorkerKey(s.spec.pod, s.spec.dp_rank) for s in pool.streams}
    for key, spec in wanted.items():
        if key not in fed:
            await pool.add(spec)
            followed[key] = spec
            log.info("dynamo.followed", worker=str(key), endpoint=spec.endpoint)
