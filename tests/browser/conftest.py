"""Browser tests of the dashboard: headless Debian chromium driven by Playwright (no browser
download), against a real gateway on loopback with fake upstreams.

One browser per module; each test gets a fresh context (no cookies). With
``LLMGW_SCREENSHOTS=docs/dashboard`` the tests write their page screenshots there.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Page, async_playwright, expect

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOTS = os.environ.get("LLMGW_SCREENSHOTS")
WAIT_MS = 15_000  # how long an expectation waits for the page (a loaded machine is slow)

expect.set_options(timeout=WAIT_MS)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def browser() -> AsyncIterator[Browser]:
    """One headless chromium for the module."""
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        yield browser
        await browser.close()


@pytest_asyncio.fixture(loop_scope="module")
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    """A fresh browser profile for one test."""
    ctx = await browser.new_context(viewport={"width": 1360, "height": 900})
    ctx.set_default_timeout(WAIT_MS)
    yield ctx
    await ctx.close()


async def sign_in(page: Page, url: str, key: str) -> None:
    """Sign in through the form and wait for the overview to be filled."""
    await page.goto(f"{url}/dashboard")
    await page.fill("#key", key)
    await page.click("button[type=submit]")
    await page.wait_for_url("**/dashboard/overview")
    await ready(page)


async def ready(page: Page) -> None:
    """Wait until the page's script has filled it from the API."""
    await page.wait_for_selector("body[data-ready='1']", state="attached")


async def screenshot(page: Page, name: str) -> None:
    """Save ``name``.png when LLMGW_SCREENSHOTS names a directory."""
    if SCREENSHOTS:
        await asyncio.to_thread(Path(SCREENSHOTS).mkdir, parents=True, exist_ok=True)
        await page.screenshot(path=str(Path(SCREENSHOTS) / f"{name}.png"), full_page=True)
