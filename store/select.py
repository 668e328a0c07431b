"""Pick the store backend from a URL, importing only the chosen one (as uvicorn does).

Imports neither zmq nor fastapi; redis only when a Redis URL is given.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import parse_qsl, urlencode, urlsplit

from kvsi.store.base import IndexStore, ReplicaRoster


def _memory(url: str) -> IndexStore:
    from kvsi.store.memory import MemoryStore

    return MemoryStore()


def _redis(url: str) -> IndexStore:
    from kvsi.store.redis import RedisStore

    return RedisStore.from_url(url)


BACKENDS: dict[str, Callable[[str], IndexStore]] = {
    "memory": _memory,
    "redis": _redis,
    "rediss": _redis,
    "redis+cluster": _redis,
    "rediss+cluster": _redis,
}
"""URL scheme (or the bare word `memory`) -> the backend's opener, which imports only that
backend; mypy checks each backend against IndexStore where its opener returns it."""


def _redis_roster(url: str) -> ReplicaRoster:
    from kvsi.store.redis.roster import RedisRoster

    return RedisRoster.from_url(url)


ROSTERS: dict[str, Callable[[str], ReplicaRoster]] = {
    scheme: _redis_roster for scheme, opener in BACKENDS.items() if opener is _redis
}
"""URL scheme -> the opener of the central replicas' roster: shared stores only (the memory
store is one process's)."""


class StoreURLError(ValueError):
    """A store this process cannot open: unknown scheme, bad option, client not installed.
    The message shows the URL with its password masked."""


def open_store(url: str) -> IndexStore:
    """A store for `url`; raises StoreURLError listing the valid forms for an unknown one."""
    scheme = url if "://" not in url else urlsplit(url).scheme
    shown = masked(url)
    opener = BACKENDS.get(scheme) if (scheme == "memory") == (url == "memory") else None
    if opener is None:
        valid = ", ".join(f"{name}" if name == "memory" else f"{name}://..." for name in BACKENDS)
        raise StoreURLError(f"unknown store {shown!r}; valid: {valid}")
    try:
        store = opener(url)
    except ImportError as exc:
        raise StoreURLError(
            f"store {shown!r} needs the Redis client, which is not installed ({exc}): "
            "pip install 'kv-session-index[redis]'"
        ) from exc
    except ValueError as exc:
        reason = str(exc).replace(url, shown)
        raise StoreURLError(reason if shown in reason else f"store {shown!r}: {reason}") from exc
    return store


def open_roster(url: str) -> ReplicaRoster:
    """The replicas' roster of the shared store at `url`; StoreURLError for a store that is
    not shared (memory) or cannot be opened."""
    scheme = url if "://" not in url else urlsplit(url).scheme
    opener = ROSTERS.get(scheme)
    if opener is None:
        raise StoreURLError(
            f"store {masked(url)!r} is not shared: replicas split pods over "
            f"{', '.join(f'{name}://...' for name in ROSTERS)} only"
        )
    try:
        return opener(url)
    except ValueError as exc:
        raise StoreURLError(str(exc).replace(url, masked(url))) from exc


def masked(url: str) -> str:
    """`url` with every secret in it shown as `***`, for logs and error messages: the
    password of `user:password@`, and the value of a query option whose name says it holds
    one (`password`, `ssl_password`, a token or secret: redis-py takes them from the URL)."""
    if "://" not in url:
        return url
    split = urlsplit(url)
    if split.password is not None:
        split = split._replace(netloc=split.netloc.replace(f":{split.password}@", ":***@", 1))
    if split.query:
        options = parse_qsl(split.query, keep_blank_values=True)
        if any(_secret(name) for name, _ in options):
            hidden = [(name, "***" if _secret(name) else value) for name, value in options]
            split = split._replace(query=urlencode(hidden, safe="*"))
    return split.geturl()


def _secret(option: str) -> bool:
    name = option.lower()
    return any(word in name for word in ("password", "secret", "token"))
