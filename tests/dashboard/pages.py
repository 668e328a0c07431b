"""What the dashboard tests read off the page, and how they wait for it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tests.paths import ROOT

if TYPE_CHECKING:
    from playwright.async_api import Browser, ConsoleMessage, Page

T = TypeVar("T")

SCREENSHOTS = os.environ.get("KVSI_SCREENSHOTS")
"""A directory (relative to the repository) to copy the README's screenshot into, or None."""


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


async def heatmap(page: Page) -> dict[str, list[str]] | None:
    """The heatmap's row (worker) and column (session) headers, once it has cells."""
    heat: dict[str, list[str]] = await page.evaluate(
        """() => ({
            rows: [...document.querySelectorAll('#heatmap tbody th')].map(t => t.textContent),
            columns: [...document.querySelectorAll('#heatmap thead th')].slice(1)
                .map(t => t.textContent),
        })"""
    )
    return heat if heat["rows"] and heat["columns"] else None


async def sessions_table(page: Page) -> list[tuple[str, int]]:
    """The sessions table's rows as (session id, blocks), top to bottom."""
    rows: list[tuple[str, int]] = await page.eval_on_selector_all(
        "#sessions tbody tr",
        """rows => rows.map(r =>
            [r.dataset.session, Number(r.querySelector('.blocks').textContent)])""",
    )
    return [(sid, blocks) for sid, blocks in rows]


async def focused_session(page: Page) -> str | None:
    """The session id of the table row that has the keyboard focus, if one has."""
    found: str | None = await page.evaluate("() => document.activeElement?.dataset?.session")
    return found


async def unnamed_controls(page: Page) -> list[str]:
    """Controls (inputs, selects, buttons) without an accessible name: no <label>, no
    aria-label and no text of their own."""
    found: list[str] = await page.eval_on_selector_all(
        "input, select, button, textarea",
        """els => els.filter(e => !(e.labels?.length || e.getAttribute('aria-label')
                || e.getAttribute('aria-labelledby') || e.textContent.trim()))
            .map(e => e.outerHTML)""",
    )
    return found


async def line_readings(page: Page) -> int:
    """How many readings the open session's line has taken ("N readings, ...")."""
    text = await page.locator("#session-range").text_content() or ""
    count = text.split(" ", 1)[0]
    return int(count) if count.isdigit() else 0
