"""Dynamo's standalone KV indexer API, served from the index (see api/README.md).

Imports neither zmq nor subscriber/. `create_dynamo_app` (app.py) builds the app; routes.py
holds its endpoints and `DynamoOptions`, schemas.py its bodies, scores.py the overlap answer,
registry.py the store door, headers.py the routing headers `/v1/route` returns.
"""

from kvsi.api.routers.dynamo.app import create_dynamo_app
from kvsi.api.routers.dynamo.routes import DynamoOptions

__all__ = ["DynamoOptions", "create_dynamo_app"]
