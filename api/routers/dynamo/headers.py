"""The headers Dynamo's frontend takes to send a request straight to one worker.

Imports the store model only. Dynamo's frontend routes a request whose `x-worker-instance-id`
(and `x-dp-rank`) header names a worker instance to that instance, skipping its own router
(`lib/llm/src/protocols/openai/nvext.rs` in ai-dynamo/dynamo). A worker has such an id when
it was registered through the Dynamo API (`POST /register`).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvsi.store.model import WorkerKey
from kvsi.store.registry import DynamoInstance

INSTANCE_HEADER = "x-worker-instance-id"
DP_RANK_HEADER = "x-dp-rank"


def routing_headers(instances: Iterable[DynamoInstance]) -> dict[WorkerKey, dict[str, str]]:
    """Per registered worker, the header values that route a request to it (strings, as
    headers are: instance ids are u64 and exceed what a JSON number holds exactly)."""
    return {
        i.worker: {INSTANCE_HEADER: str(i.instance_id), DP_RANK_HEADER: str(i.dp_rank)}
        for i in instances
    }
