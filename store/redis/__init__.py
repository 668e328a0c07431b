"""The shared index on Redis or Redis Cluster: `RedisStore`, one module per role.

Imports neither zmq nor fastapi; redis-py only here, so the memory store never loads it.
"""

from kvsi.store.redis.store import RedisStore

__all__ = ["RedisStore"]
