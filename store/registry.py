"""Dynamo's registrations as the store keeps them: a name for one of the index's workers.

Imports msgspec and the store's domain model only. Not part of the index: no worker, entry or
session changes with a registration (the index is store/model.py's).
"""

from __future__ import annotations

import msgspec

from kvsi.store.model import WorkerKey


class DynamoInstance(msgspec.Struct, frozen=True):
    """One data-parallel rank of a Dynamo worker instance, registered through the Dynamo API,
    and the worker (pod, dp_rank) whose index answers for it.

    Not part of the index: a name for one of its workers, kept by the store so every API
    replica maps Dynamo's instance ids the same way.
    """

    instance_id: int
    dp_rank: int
    pod: str
    model_name: str
    routing_group: str
    block_size: int
    endpoint: str
    replay_endpoint: str | None = None
    subscribe: bool = True
    """Ingest subscribes to `endpoint` as this worker. False: the registration only names a
    worker kvsi already subscribes to (its publisher is configured or discovered)."""

    @property
    def worker(self) -> WorkerKey:
        return WorkerKey(self.pod, self.dp_rank)
