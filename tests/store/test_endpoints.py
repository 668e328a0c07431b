"""The one endpoint rule: what settings, the Dynamo API and `kvsi tail` accept."""

from __future__ import annotations

import pytest

from kvsi.store.endpoints import zmq_endpoint


@pytest.mark.parametrize(
    "endpoint",
    [
        "tcp://127.0.0.1:5557",
        "tcp://*:5557",
        "tcp://vllm-0.vllm.llm.svc:5557",
        "tcp://[::1]:5557",
        "tcp://127.0.0.1:*",
        "tcp://h:65535",
        "ipc:///tmp/kv.sock",
        "inproc://kv",
    ],
)
def test_a_zmq_endpoint_is_accepted_as_given(endpoint: str) -> None:
    assert zmq_endpoint(endpoint) == endpoint


@pytest.mark.parametrize(
    ("endpoint", "says"),
    [
        ("notaurl", "must start with tcp://, ipc:// or inproc://"),
        ("http://h:1", "must start with tcp://"),
        ("tcp://127.0.0.1:1/0", "must be tcp://HOST:PORT"),
        ("tcp://127.0.0.1", "must be tcp://HOST:PORT"),
        ("tcp://[::1:1", "must be tcp://HOST:PORT"),
        ("tcp://:5557", "must be tcp://HOST:PORT"),
        ("tcp://h:0", "port 0 is not 1-65535"),
        ("tcp://h:99999", "port 99999 is not 1-65535"),
        ("ipc://", "names no path"),
        ("inproc://", "names no path"),
    ],
)
def test_a_bad_zmq_endpoint_says_what_is_wrong(endpoint: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("*", r"\*")):
        zmq_endpoint(endpoint)
