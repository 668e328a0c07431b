"""The dashboard in a real headless Chromium against a real `kvsi serve --demo` process."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.dashboard.conftest import TOKEN, Demo
from tests.dashboard.pages import (
    api_view,
    fleet_rows,
    heatmap,
    line_readings,
    open_page,
    screenshot,
    session_shown,
    sessions_table,
    unnamed_controls,
)
from tests.waiting import until

if TYPE_CHECKING:
    from playwright.async_api import Browser, Page, Route

pytestmark = [pytest.mark.e2e, pytest.mark.browser]


async def test_the_page_shows_the_fleet_finds_a_session_and_matches_the_api(
    browser: Browser, demo: Demo, tmp_path: Path
) -> None:
    errors: list[str] = []
    async with httpx.AsyncClient(base_url=demo.url, timeout=10) as api:
        page = await open_page(browser, demo.url + "/", errors)
        pods = await until(
            lambda: _all_live(page), 30, "the three simulated pods shown live in the fleet view"
        )
        listed = (await api.get("/v1/pods")).json()["pods"]
        assert sorted(pods) == sorted(p["pod"] for p in listed)
        lags = [r["lag"] for r in (await fleet_rows(page)).values()]
        assert all(re.fullmatch(r"\d+ \(\d+\.\d s\)", lag) for lag in lags), lags

        sessions = (await api.get("/v1/sessions", params={"limit": "25"})).json()["sessions"]
        assert sessions, "the demo has sessions"
        # The least recently seen session of the page changes least while the test reads it.
        wanted = sessions[-1]["session_id"]
        await page.get_by_label("Session id").fill(wanted)
        await page.get_by_label("Session id").press("Enter")
        await page.locator("#session").wait_for(state="visible", timeout=5000)
        assert await page.locator("#session-id").text_content() == wanted

        async def same() -> tuple[dict[str, Any], dict[str, Any]] | None:
            shown = await session_shown(page)
            body = (await api.get(f"/v1/sessions/{wanted}")).json()
            return (shown, body) if shown == api_view(body) else None

        shown, body = await until(same, 15, "the session view's numbers equal the API's")
        assert shown["total"] == body["total_blocks"] >= 1
        assert sum(shown["media"].values()) >= shown["total"]
        assert "readings" in (await page.locator("#session-range").text_content() or "")

        heat = await until(lambda: heatmap(page), 10, "the heatmap drawn")
        assert sorted(heat["rows"]) == sorted(f"{p['pod']}/{p['dp_rank']}" for p in listed)
        assert 1 <= len(heat["columns"]) <= 10
        for column in heat["columns"]:  # the page moves on with the demo: each is a session
            assert (await api.get(f"/v1/sessions/{column}")).status_code == 200

        # Every session again, sorted by the server: each redraw of the moving first page.
        await page.get_by_label("Session id").fill("")
        await page.get_by_label("Session id").press("Enter")
        await page.get_by_label("Sort by").select_option("blocks")

        async def by_blocks() -> bool:
            blocks = [b for _, b in await sessions_table(page)]
            return len(blocks) > 1 and blocks == sorted(blocks, reverse=True)

        await until(by_blocks, 10, "the whole list sorted by blocks")
        assert await page.locator("#session-id").text_content() == wanted  # still open
        assert await unnamed_controls(page) == []

        async def three_readings() -> bool:
            return await line_readings(page) >= 3

        await until(three_readings, 15, "the line's readings, one a second")
        # The picture: just after the heatmap's redraw (every 5 s), as fresh as the table.
        draws = await page.locator("#heatmap").get_attribute("data-draws")

        async def redrawn() -> bool:
            return await page.locator("#heatmap").get_attribute("data-draws") != draws

        await until(redrawn, 15, "the heatmap redrawn")
        await screenshot(page, tmp_path, "session", for_readme=True)
        assert errors == []

        # Chromium logs the 404 an unknown id answers as a console error, so this comes last.
        await page.get_by_label("Session id").fill("no-such-session")
        await page.get_by_label("Session id").press("Enter")
        await until(lambda: page.locator("#search-result").text_content(), 5, "a not-found message")
        assert "no-such-session" in (await page.locator("#search-result").text_content() or "")


async def _all_live(page: Page) -> list[str] | None:
    rows = await fleet_rows(page)
    live = len(rows) == 3 and all(r["state"] == "live" for r in rows.values())
    return sorted(rows) if live else None


async def _events_seen(page: Page) -> int:
    return int(await page.locator("#feed").get_attribute("data-events") or 0)


async def test_live_updates_arrive_and_follow_a_server_restart(
    browser: Browser, demo: Demo, tmp_path: Path
) -> None:
    page = await open_page(browser, demo.url + "/")
    await until(lambda: _all_live(page), 30, "pods live")
    before = await fleet_rows(page)
    seen = await _events_seen(page)
    await until(lambda: _more_than(page, seen), 5, "a change from /v1/watch")

    async def fleet_moved() -> bool:
        now = await fleet_rows(page)
        return any(now[p]["seq"] != before[p]["seq"] for p in before)

    await until(fleet_moved, 5, "the fleet view redrawn from a live update")

    await demo.restart()
    # The feed reconnects on its own (backing off), no reload: new changes arrive again.
    seen = await _events_seen(page)
    await until(lambda: _more_than(page, seen), 30, "changes after the server restarted")
    assert await page.locator("#feed").get_attribute("data-state") == "live"
    await screenshot(page, tmp_path, "after-restart")


async def _more_than(page: Page, count: int) -> bool:
    return await _events_seen(page) > count


HIDE = """hidden => {
  Object.defineProperty(document, "hidden", { configurable: true, get: () => hidden });
  document.dispatchEvent(new Event("visibilitychange"));
}"""


async def test_a_background_tab_reads_nothing_until_shown_again(
    browser: Browser, demo: Demo
) -> None:
    page = await open_page(browser, demo.url + "/")
    await until(lambda: _all_live(page), 30, "pods live")
    await page.evaluate(HIDE, True)
    reads: list[str] = []
    page.on("request", lambda r: reads.append(r.url) if "/v1/watch" not in r.url else None)
    seen = await _events_seen(page)
    await until(lambda: _more_than(page, seen + 50), 30, "changes while hidden")
    await page.wait_for_timeout(6000)  # past the heatmap's 5 s timer
    assert reads == [], "a hidden tab still read the API"
    assert await page.locator("#feed").get_attribute("data-state") == "live"

    await page.evaluate(HIDE, False)

    async def caught_up() -> bool:
        return any("order=blocks" in url for url in reads) and any(
            "/v1/pods" in url for url in reads
        )

    await until(caught_up, 10, "the heatmap and the fleet read again once shown")


async def test_a_heatmap_read_under_way_when_the_tab_hides_stops_there(
    browser: Browser, demo: Demo
) -> None:
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    asked = asyncio.Event()
    release = asyncio.Event()

    async def hold(route: Route) -> None:
        if not asked.is_set():
            asked.set()
            await release.wait()
        await route.continue_()

    await page.route(lambda url: "order=blocks" in url, hold)
    await page.goto(demo.url + "/")
    await asyncio.wait_for(asked.wait(), 30)
    await page.evaluate(HIDE, True)
    reads: list[str] = []
    page.on("request", lambda r: reads.append(r.url) if "/v1/sessions/" in r.url else None)
    release.set()
    await page.wait_for_timeout(2000)
    assert reads == [], "the sessions of the heatmap were read while hidden"

    await page.evaluate(HIDE, False)

    async def drawn() -> bool:
        return await page.locator("#heatmap").get_attribute("data-draws") is not None

    await until(drawn, 10, "the heatmap read and drawn once shown")
    assert reads, "the heatmap drawn without reading its sessions"


async def test_with_tokens_the_page_asks_for_one_and_sends_it(
    browser: Browser, guarded_demo: Demo, tmp_path: Path
) -> None:
    async with httpx.AsyncClient(base_url=guarded_demo.url, timeout=10) as api:
        assert (await api.get("/")).status_code == 200
        assert (await api.get("/v1/pods")).status_code == 401
    page = await open_page(browser, guarded_demo.url + "/")
    token = page.get_by_label("Token", exact=True)
    await token.wait_for(state="visible", timeout=10000)
    await screenshot(page, tmp_path, "token-prompt")

    await token.fill("wrong")
    await token.press("Enter")

    async def rejected() -> bool:
        return "invalid" in (await page.locator("#token-error").text_content() or "")

    await until(rejected, 10, "the wrong token rejected")

    await token.fill(TOKEN)
    await token.press("Enter")
    await until(lambda: _all_live(page), 30, "the fleet shown with the token")
    assert await page.locator("#token-form").is_hidden()
    seen = await _events_seen(page)
    await until(lambda: _more_than(page, seen), 10, "changes from /v1/watch with the token")
