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


class StoreURLError(ValueError):
    """A store this process cannot open: unknown scheme, bad option, client not installed.
    The message shows the URL with its password masked."""


def open_store(url: str) -> IndexStore:
    """A store for `url`; raises StoreURLError listing the valid forms for an unknown one."""
    scheme = url if "://" not in url else urlsplit(url).scheme
    shown = masked(url)
    target = BACKENDS.get(scheme)
    if target is None:
        valid = ", ".join(f"{name}" if name == "memory" else f"{name}://..." for name in BACKENDS)
        raise StoreURLError(f"unknown store {shown!r}; valid: {valid}")
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise StoreURLError(
            f"store {shown!r} needs the Redis client, which is not installed ({exc}): "
            "pip install 'kv-session-index[redis]'"
        ) from exc
    backend = getattr(module, class_name)
    try:
        store: IndexStore = backend() if scheme == "memory" else backend.from_url(url)
    except ValueError as exc:
        raise StoreURLError(str(exc).replace(url, shown)) from exc
    return store


def masked(url: str) -> str:
    """`url` with its password (if any) shown as `***`, for logs and error messages."""
    if "://" not in url:
        return url
    split = urlsplit(url)
    if split.password is None:
        return url
    netloc = split.netloc.replace(f":{split.password}@", ":***@", 1)
    return split._replace(netloc=netloc).geturl()
