"""The Dynamo API's door to the store: the index's reads plus the registration writes.

Imports neither zmq nor subscriber/. Registrations are not the index (no worker, entry or
session changes): they name some of its workers with Dynamo's instance ids, so every API
replica answers Dynamo's clients alike. Failures map as the reader's (`api.reader.Guarded`):
a store outage is a 503, never a 500.
"""

from __future__ import annotations

from typing import Protocol, cast

from fastapi import Request

from kvsi.api.reader import Guarded
from kvsi.store.base import DynamoRegistry, IndexReader, IndexStore


class RegistryDoor(IndexReader, DynamoRegistry, Protocol):
    """What the Dynamo API uses: the index's reads plus recording and forgetting Dynamo
    registrations."""


def guarded_door(store: IndexStore) -> RegistryDoor:
    """`store`'s reads and registrations, behind a `Guarded` door."""
    return cast(RegistryDoor, Guarded(store))


async def get_door(request: Request) -> RegistryDoor:
    """FastAPI dependency: the door the Dynamo app put on its state."""
    return cast(RegistryDoor, request.app.state.door)
