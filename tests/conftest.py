"""Fixtures every test package shares."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq.asyncio


@pytest.fixture
def ctx() -> Iterator[zmq.asyncio.Context]:
    """A private ZMQ context, so a test's leftover socket cannot leak into the next test."""
    context = zmq.asyncio.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)
