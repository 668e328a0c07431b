"""Cursor paging over in-memory collections, in the orders the API promises.

Imports nothing from the subscriber or the API. Cursors are the last item's sort key in
text form, so a page stays correct while the collection changes between calls.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable

from store.model import Hash, InvalidCursorError, Page, SessionSummary, format_hash, parse_hash

HashKey = tuple[int, int | bytes]


def hash_order(h: Hash) -> HashKey:
    """Ints (numerically) before digests (bytewise): one total order over both kinds."""
    return (1, h) if isinstance(h, bytes) else (0, h)


def page_hashes(hashes: Iterable[Hash], limit: int, cursor: str | None) -> Page[Hash]:
    """The `limit` smallest hashes after `cursor`. O(n log limit)."""
    if cursor is not None:
        try:
            after = hash_order(parse_hash(cursor))
        except ValueError as exc:
            raise InvalidCursorError(f"cursor {cursor!r}: {exc}") from None
        hashes = (h for h in hashes if hash_order(h) > after)
    chosen = heapq.nsmallest(limit + 1, hashes, key=hash_order)
    more = len(chosen) > limit
    items = chosen[:limit]
    return Page(items=items, next_cursor=format_hash(items[-1]) if more else None)


def _session_order(s: SessionSummary) -> tuple[float, str]:
    return (-s.last_seen, s.session_id)


def encode_session_cursor(s: SessionSummary) -> str:
    return f"{s.last_seen!r}|{s.session_id}"


def decode_session_cursor(cursor: str) -> tuple[float, str]:
    seen, sep, session_id = cursor.partition("|")
    try:
        if not sep:
            raise ValueError("missing '|'")
        value = float(seen)
        if not math.isfinite(value):
            raise ValueError("not a finite time")
        return (-value, session_id)
    except ValueError as exc:
        raise InvalidCursorError(f"cursor {cursor!r} is not a session cursor: {exc}") from None


def page_sessions(
    sessions: Iterable[SessionSummary], limit: int, cursor: str | None
) -> Page[SessionSummary]:
    """Most recently seen first, ties by session id. O(n log limit)."""
    if cursor is not None:
        after = decode_session_cursor(cursor)
        sessions = (s for s in sessions if _session_order(s) > after)
    chosen = heapq.nsmallest(limit + 1, sessions, key=_session_order)
    more = len(chosen) > limit
    items = chosen[:limit]
    return Page(items=items, next_cursor=encode_session_cursor(items[-1]) if more else None)
