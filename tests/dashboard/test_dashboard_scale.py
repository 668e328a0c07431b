"""The dashboard over 100 workers and 100,000 sessions: it fetches what it shows, no more.

The index is seeded once and then still, so every number on the page is known. No timing
is asserted (the machine is shared): the requests the page made, and what it shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from tests.dashboard.conftest import SESSIONS, WORKERS, BigIndex, session_blocks, session_id
from tests.dashboard.pages import (
    fleet_rows,
    focused_session,
    heatmap,
    line_readings,
    open_page,
    screenshot,
    sessions_table,
    unnamed_controls,
)
from tests.waiting import until

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

PAGE_SIZE = 25
"""The page's sessions per table page (api/static/app.js)."""
HEATMAP_SESSIONS = 10
"""Columns of the heatmap (api/static/app.js)."""
SESSION_VIEWS = 3 * HEATMAP_SESSIONS + 5
"""At most the heatmap's columns read at load and after the feed connects (with room for
one more redraw), and the few sessions the test opens: never one per listed session."""

BY_BLOCKS = sorted(range(SESSIONS), key=lambda i: (-session_blocks(i), session_id(i)))
"""Every session in the API's order=blocks."""


def by_blocks(prefix: str = "") -> list[tuple[str, int]]:
    return [
        (session_id(i), session_blocks(i)) for i in BY_BLOCKS if session_id(i).startswith(prefix)
    ]


async def table_is(page: Page, rows: list[tuple[str, int]]) -> bool:
    return await sessions_table(page) == rows


async def page_label(page: Page) -> str:
    return await page.locator("#page-label").text_content() or ""


async def test_at_100_workers_and_100000_sessions_the_page_fetches_only_what_it_shows(
    browser: Browser, big_index: BigIndex, tmp_path: Path
) -> None:
    errors: list[str] = []
    requests: list[str] = []
    page = await open_page(browser, "about:blank", errors)
    page.on("request", lambda r: requests.append(r.url))
    await page.goto(big_index.url + "/")

    async def fleet() -> dict[str, dict[str, str]] | None:
        rows = await fleet_rows(page)
        return rows if len(rows) == WORKERS else None

    rows = await until(fleet, 60, "the fleet view with every worker")
    assert all(r["state"] == "live" for r in rows.values())
    assert sum(int(r["blocks"]) for r in rows.values()) == big_index.blocks

    # The table: one page, most recently seen first (one batch stamps many: ties by id).
    first = await until(lambda: sessions_table(page), 60, "the first page of sessions")
    assert len(first) == PAGE_SIZE

    # The heatmap: the fleet's busiest sessions, whatever the table shows.
    busiest = [session_id(i) for i in range(HEATMAP_SESSIONS)]

    async def heat_drawn() -> dict[str, list[str]] | None:
        heat = await heatmap(page)
        return heat if heat and heat["columns"] == busiest else None

    heat = await until(heat_drawn, 60, "the heatmap of the busiest sessions")
    assert len(heat["rows"]) == WORKERS
    top = page.locator("#heatmap td[title^='sess-000000 on vllm-000/0:']")
    assert await top.text_content() == str(session_blocks(0))

    # Sort by blocks: the server sorts all 100,000 and the table gets the first page.
    await page.get_by_label("Sort by").select_option("blocks")
    await until(lambda: table_is(page, by_blocks()[:PAGE_SIZE]), 60, "sorted by blocks")
    await page.get_by_role("button", name="Next page").click()
    await until(lambda: table_is(page, by_blocks()[PAGE_SIZE : 2 * PAGE_SIZE]), 60, "page 2")
    assert (await page_label(page)).startswith("page 2, most blocks first")

    # Prefix search, still by blocks, paged by the API's cursors.
    matching = by_blocks("sess-0012")
    assert len(matching) == 100
    await page.get_by_label("Session id").fill("sess-0012")
    await page.get_by_label("Session id").press("Enter")
    await until(lambda: table_is(page, matching[:PAGE_SIZE]), 60, "the ids starting sess-0012")
    await page.get_by_role("button", name="Next page").click()
    await until(lambda: table_is(page, matching[PAGE_SIZE : 2 * PAGE_SIZE]), 60, "their page 2")
    assert await page.locator("#session").is_hidden()  # no session is called just sess-0012

    # An id typed whole also opens its session.
    await page.get_by_label("Session id").fill("sess-000123")
    await page.get_by_label("Session id").press("Enter")
    await until(lambda: table_is(page, by_blocks("sess-000123")), 60, "the one session")
    await page.locator("#session").wait_for(state="visible", timeout=30000)
    assert await page.locator("#session-id").text_content() == "sess-000123"

    # Back to every session; keyboard only: Tab into the table, arrows, Enter, Escape.
    await page.get_by_label("Session id").fill("")
    await page.get_by_label("Session id").press("Enter")
    await until(lambda: table_is(page, by_blocks()[:PAGE_SIZE]), 60, "every session again")
    await page.get_by_label("Sort by").focus()
    await page.keyboard.press("Tab")
    assert await focused_session(page) == session_id(0)
    await page.keyboard.press("ArrowDown")
    await page.keyboard.press("ArrowDown")
    await page.keyboard.press("ArrowUp")
    await page.keyboard.press("ArrowDown")
    assert await focused_session(page) == session_id(2)
    await page.keyboard.press("Enter")

    async def opened() -> bool:  # the view is still open on sess-000123 until this loads
        shown = await page.locator("#session").is_visible()
        return shown and await page.locator("#session-id").text_content() == session_id(2)

    await until(opened, 30, "the session view of the row")

    # Nothing changes in this index, yet the line takes a reading every tick.
    async def three_readings() -> bool:
        return await line_readings(page) >= 3

    await until(three_readings, 30, "three readings of a still session")
    held = session_blocks(2)
    line = await page.locator("#session-range").text_content() or ""
    assert line.endswith(f" readings, {held} to {held} blocks"), line
    await screenshot(page, tmp_path, "scale")
    await page.keyboard.press("Escape")
    assert await page.locator("#session").is_hidden()
    assert await focused_session(page) == session_id(2)

    assert await unnamed_controls(page) == []
    # Chromium logs the 404 of looking up "sess-0012" (no such id) as a console error.
    assert [e for e in errors if "404 (Not Found)" not in e] == []

    # What the page asked for: pages of at most PAGE_SIZE, and session views only for the
    # heatmap's columns and the sessions opened.
    paths = [unquote(urlsplit(u).path) for u in requests]
    queries = [parse_qs(urlsplit(u).query) for u in requests]
    lists = [q for p, q in zip(paths, queries, strict=True) if p == "/v1/sessions"]
    assert lists and all(int(q["limit"][0]) <= PAGE_SIZE for q in lists)
    assert len(lists) <= 20
    views = [p.removeprefix("/v1/sessions/") for p in paths if p.startswith("/v1/sessions/")]
    assert len(views) <= SESSION_VIEWS
    opened = {"sess-0012", "sess-000123", session_id(2)}
    assert set(views) <= set(busiest) | opened
    assert not [p for p in paths if p.endswith("/blocks")]
    assert sum(p == "/v1/pods" for p in paths) <= 10
