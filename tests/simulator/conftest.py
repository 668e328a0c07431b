"""Fixtures of the simulator tests: one zmq context per test, destroyed after it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import zmq.asyncio


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    """A private context, so a test's leftover socket cannot leak into the next test."""
    context = zmq.asyncio.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)
