"""Pick the store backend from a URL, importing only the chosen one (as uvicorn does).

Imports neither zmq nor fastapi; redis only when a Redis URL is given.
"""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit

from store.base import IndexStore

BACKENDS = {
    "memory": "store.memory:MemoryStore",
    "redis": "store.redis:RedisStore",
    "rediss": "store.redis:RedisStore",
    "redis+cluster": "store.redis:RedisStore",
    "rediss+cluster": "store.redis:RedisStore",
}
"""URL scheme (or the bare word `memory`) -> `module:class` of the backend."""


def open_store(url: str) -> IndexStore:
    """A store for `url`; raises ValueError listing the valid forms for an unknown one."""
    scheme = url if "://" not in url else urlsplit(url).scheme
    target = BACKENDS.get(scheme)
    if target is None:
        valid = ", ".join(f"{name}" if name == "memory" else f"{name}://..." for name in BACKENDS)
        raise ValueError(f"unknown store {url!r}; valid: {valid}")
    module_name, class_name = target.split(":")
    backend = getattr(importlib.import_module(module_name), class_name)
    store: IndexStore = backend() if scheme == "memory" else backend.from_url(url)
    return store
