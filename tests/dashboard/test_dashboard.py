"""The dashboard in a real headless Chromium against a real `kvsi serve --demo` process."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import pytest

from tests.dashboard.conftest import TOKEN, Demo

if TYPE_CHECKING:
    from playwright.async_api import Browser, ConsoleMessage, Page

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

T = TypeVar("T")
ROOT = Path(__file__).parents[2]

SCREENSHOTS = os.environ.get("KVSI_SCREENSHOTS")
"""A directory (relative to the repository) to copy the README's screenshot into, or None."""


async def until(check: Callable[[], Awaitable[T | None]], within: float, what: str) -> T:
    """Poll `check` until it returns something truthy (returned); fail after `within` s."""
    deadline = time.monotonic() + within
    last: object = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what}: not within {within}s (last: {last!r})")


async def open_page(browser: Browser, url: str, errors: list[str] | None = None) -> Page:
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    if errors is not None:
        page.on("console", lambda m: _console(m, errors))
        page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    await page.goto(url)
    return page


def _console(message: ConsoleMessage, errors: list[str]) -> None:
    if message.type == "error":
        errors.append(message.text)


async def fleet_rows(page: Page) -> dict[str, dict[str, str]]:
    """The fleet table as {pod: {state, blocks, seq, lag}}."""
    rows: list[dict[str, str]] = await page.eval_on_selector_all(
        "#fleet tbody tr",
        """rows => rows.map(r => ({pod: r.dataset.pod, state: r.dataset.state,
            blocks: r.querySelector('.blocks').textContent,
            seq: r.querySelector('.seq').textContent,
            lag: r.querySelector('.lag').textContent}))""",
    )
    return {r["pod"]: r for r in rows}


async def session_shown(page: Page) -> dict[str, Any]:
    """What the session view says: total, blocks per worker, blocks per medium."""
    shown: dict[str, Any] = await page.evaluate(
        """() => ({
            total: Number(document.querySelector('#session-total').textContent),
            pods: [...document.querySelectorAll('#session-pods tbody tr')].map(r =>
                [r.dataset.pod, Number(r.dataset.rank),
                 Number(r.querySelector('.blocks').textContent)]),
            media: Object.fromEntries([...document.querySelectorAll('#session-media li')].map(
                li => [li.dataset.medium, Number(li.querySelector('.blocks').textContent)])),
        })"""
    )
    return shown


def api_view(body: dict[str, Any]) -> dict[str, Any]:
    """The API's session answer in the shape of `session_shown`."""
    media: dict[str, int] = {}
    for worker in body["pods"]:
        for medium, n in worker["by_medium"].items():
            media[medium] = media.get(medium, 0) + n
    return {
        "total": body["total_blocks"],
        "pods": [[w["pod"], w["dp_rank"], w["blocks"]] for w in body["pods"]],
        "media": media,
    }


async def screenshot(page: Page, tmp_path: Path, name: str, *, for_readme: bool = False) -> Path:
    shot = tmp_path / f"{name}.png"
    await page.screenshot(path=shot, full_page=True)
    if for_readme and SCREENSHOTS:
        target = ROOT / SCREENSHOTS / "dashboard.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, target)
    return shot


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

        heat = await until(lambda: _heatmap(page), 10, "the heatmap drawn")
        assert sorted(heat["rows"]) == sorted(f"{p['pod']}/{p['dp_rank']}" for p in listed)
        assert 1 <= len(heat["columns"]) <= 10
        for column in heat["columns"]:  # the page moves on with the demo: each is a session
            assert (await api.get(f"/v1/sessions/{column}")).status_code == 200
        await screenshot(page, tmp_path, "session", for_readme=True)
        assert errors == []

        # Chromium logs the 404 an unknown id answers as a console error, so this comes last.
        await page.get_by_label("Session id").fill("no-such-session")
        await page.get_by_label("Session id").press("Enter")
        await until(lambda: page.locator("#search-result").text_content(), 5, "a not-found message")
        assert "no-such-session" in (await page.locator("#search-result").text_content() or "")


async def _heatmap(page: Page) -> dict[str, list[str]] | None:
    """The heatmap's row (worker) and column (session) headers, once it has cells."""
    heat: dict[str, list[str]] = await page.evaluate(
        """() => ({
            rows: [...document.querySelectorAll('#heatmap tbody th')].map(t => t.textContent),
            columns: [...document.querySelectorAll('#heatmap thead th')].slice(1)
                .map(t => t.textContent),
        })"""
    )
    return heat if heat["rows"] and heat["columns"] else None


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
