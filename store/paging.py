"""Cursor paging over in-memory collections, in the orders the API promises.

Imports nothing from the subscriber or the API. Cursors are the last item's sort key in
text form, so a page stays correct while the collection changes between calls.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from typing import Literal

from kvsi.store.hashtext import format_hash, parse_hash
from kvsi.store.model import Hash, InvalidCursorError, Page, SessionSummary

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


SessionOrder = Literal["last_seen", "blocks"]
"""The session list's orders: most recently seen first, or most resident blocks first."""

Place = tuple[float, str]
"""A session's place in a listing, ascending: (-last_seen or -blocks, session id)."""

_BLOCKS_CURSOR = "blocks:"
"""Marks an order=blocks cursor; an order=last_seen one starts with a float instead."""


def session_place(s: SessionSummary, order: SessionOrder) -> Place:
    return (-s.blocks if order == "blocks" else -s.last_seen, s.session_id)


def encode_session_cursor(s: SessionSummary, order: SessionOrder) -> str:
    if order == "blocks":
        return f"{_BLOCKS_CURSOR}{s.blocks}|{s.session_id}"
    return f"{s.last_seen!r}|{s.session_id}"


def decode_session_cursor(cursor: str, order: SessionOrder) -> Place:
    """The place after which the next page starts; a cursor of the other order is refused
    (its key compares with the wrong field, so the page would be silently wrong)."""
    by_blocks = cursor.startswith(_BLOCKS_CURSOR)
    if by_blocks != (order == "blocks"):
        other = "blocks" if by_blocks else "last_seen"
        raise InvalidCursorError(
            f"cursor {cursor!r} is from order={other}, not order={order}: "
            "start again from the first page"
        )
    key, sep, session_id = cursor.removeprefix(_BLOCKS_CURSOR).partition("|")
    try:
        if not sep:
            raise ValueError("missing '|'")
        if by_blocks:
            if not key.isdigit():
                raise ValueError("blocks must be a count")
            return (-int(key), session_id)
        value = float(key)
        if not math.isfinite(value):
            raise ValueError("not a finite time")
        return (-value, session_id)
    except ValueError as exc:
        raise InvalidCursorError(f"cursor {cursor!r} is not a session cursor: {exc}") from None


def page_sessions(
    sessions: Iterable[SessionSummary], limit: int, cursor: str | None, order: SessionOrder
) -> Page[SessionSummary]:
    """In `order` (most recently seen, or most blocks, first), ties by session id.
    O(n log limit)."""
    if cursor is not None:
        after = decode_session_cursor(cursor, order)
        sessions = (s for s in sessions if session_place(s, order) > after)
    chosen = heapq.nsmallest(limit + 1, sessions, key=lambda s: session_place(s, order))
    more = len(chosen) > limit
    items = chosen[:limit]
    return Page(items=items, next_cursor=encode_session_cursor(items[-1], order) if more else None)
