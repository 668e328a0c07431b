"""The Dynamo API's door to the store: the index's reads plus the registration writes.

Imports neither zmq nor subscriber/. Registrations are not the index (no worker, entry or
session changes): they name some of its workers with Dynamo's instance ids, so every API
replica answers Dynamo's clients alike. Failures map as IndexReader's: a store outage is a
503, never a 500.
"""

from __future__ import annotations

from typing import cast

from fastapi import Request

from api.reader import IndexReader
from store.model import DynamoInstance


class RegistryDoor(IndexReader):
    """IndexReader plus recording and forgetting Dynamo registrations."""

    async def register_instance(self, instance: DynamoInstance) -> DynamoInstance | None:
        return await self._call("register_instance", self._store.register_instance(instance))

    async def unregister_instance(
        self, instance_id: int, dp_rank: int | None
    ) -> list[DynamoInstance]:
        return await self._call(
            "unregister_instance", self._store.unregister_instance(instance_id, dp_rank)
        )


async def get_door(request: Request) -> RegistryDoor:
    """FastAPI dependency: the door the Dynamo app put on its state."""
    return cast(RegistryDoor, request.app.state.door)
