"""A worker's publisher address (a ZMQ endpoint), checked the one way every part checks it.

Imports neither zmq nor fastapi: a pure rule, so settings, the Dynamo API and `kvsi tail`
refuse the same addresses before anything dials them.
"""

from __future__ import annotations

import re

_TCP = re.compile(
    r"^tcp://(?P<host>\*|\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>\*|[0-9]{1,5})$"
)


def zmq_endpoint(value: str) -> str:
    """`value` if it is `tcp://HOST:PORT` (a name, an IPv4 address, `[IPv6]` or `*`; a port
    1-65535 or `*`), `ipc://PATH` or `inproc://NAME`; else ValueError saying what is wrong."""
    if value.startswith(("ipc://", "inproc://")):
        if value.partition("://")[2]:
            return value
        raise ValueError(f"endpoint {value!r} names no path")
    if not value.startswith("tcp://"):
        raise ValueError(f"endpoint {value!r} must start with tcp://, ipc:// or inproc://")
    found = _TCP.match(value)
    if found is None:
        raise ValueError(f"endpoint {value!r} must be tcp://HOST:PORT")
    port = found["port"]
    if port != "*" and not 1 <= int(port) <= 65535:
        raise ValueError(f"endpoint {value!r}: port {port} is not 1-65535")
    return value
