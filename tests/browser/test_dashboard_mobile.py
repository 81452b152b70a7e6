"""The dashboard in a phone-width window (390 px): no page scrolls sideways, however long a
model name or wide a table (tables scroll inside their card), the sign-in page included,
and the navigation and sign-out stay in view. In-process bus."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from gateway.dashboard.pages import PAGES
from tests.browser.conftest import ready
from tests.e2e.conftest import HI, config, model, route
from tests.fixtures.gateway import start_gateway
from tests.fixtures.upstream import FakeUpstream

if TYPE_CHECKING:
    from pathlib import Path

    from playwright.async_api import Browser, Page

ADMIN = "adm-dashboard-mobile"
LONG = "org/" + "a-very-long-model-name-" * 5 + "v2.5:7b-instruct"
SIDEWAYS = "document.documentElement.scrollWidth - window.innerWidth"

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


async def _in_view(page: Page, selector: str) -> bool:
    box = await page.locator(selector).first.bounding_box()
    return box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390


async def test_no_page_scrolls_sideways_at_phone_width(browser: Browser, tmp_path: Path) -> None:
    up = await FakeUpstream("u").start()
    gw = await start_gateway(
        config(model(LONG, *[route(up) for _ in range(4)]), admin_key=ADMIN),
        "inproc://",
        data_dir=tmp_path,
    )
    ctx = await browser.new_context(viewport={"width": 390, "height": 800})
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            for _ in range(3):  # rows for the request log
                body = {"model": LONG, "messages": HI}
                assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
        page = await ctx.new_page()
        await page.goto(f"{gw.url}/dashboard/signin")
        wide = {"signin": await page.evaluate(SIDEWAYS)}
        await page.fill("#key", ADMIN)
        await page.click("button[type=submit]")
        await page.wait_for_url("**/dashboard/overview")
        for name in PAGES:
            await page.goto(f"{gw.url}/dashboard/{name}")
            await ready(page)
            wide[name] = await page.evaluate(SIDEWAYS)
            assert await _in_view(page, "#signout"), name
            assert await _in_view(page, "header nav a[aria-current=page]"), name
        assert wide == dict.fromkeys(wide, 0)
    finally:
        await ctx.close()
        await gw.stop()
        await up.close()
