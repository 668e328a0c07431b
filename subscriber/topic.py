"""vLLM's topic convention `kv@<pod>@<model>`: the model a publisher's topic names.

Imports nothing of the project. vLLM publishes every live message under its configured
`topic`; deployments that follow llm-d's convention put the pod and the model in it.
"""

from __future__ import annotations

TOPIC_KIND = "kv"

MAX_MODEL = 256
"""Longer model names are taken for garbage: a name goes into every status write."""


def model_of_topic(topic: str | bytes) -> str | None:
    """The `<model>` of `kv@<pod>@<model>` (it may itself contain '@'); None for any other
    topic, a prefix filter such as `kv@pod-a@`, or bytes that are not UTF-8."""
    if isinstance(topic, bytes):
        try:
            topic = topic.decode()
        except UnicodeDecodeError:
            return None
    parts = topic.split("@", 2)
    if len(parts) != 3 or parts[0] != TOPIC_KIND or not parts[1]:
        return None
    if not parts[2] or len(parts[2]) > MAX_MODEL:
        return None
    return parts[2]
