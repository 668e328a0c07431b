"""How many times a Redis server ran a command (INFO commandstats): what the store's tests
count to show what a read or a write costs. Not a test module."""

from __future__ import annotations

import redis


def calls(raw: redis.Redis, command: str) -> int:
    stats = raw.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0
