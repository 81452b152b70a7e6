"""Numeric fields of the dashboard left empty (or holding no number) are refused on the page
with the field named, and nothing is sent: ``Number("")`` is 0, so an emptied weight field
zeroed the route and an emptied exploration field turned exploration off. In-process bus."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest
from playwright.async_api import BrowserContext, expect

from tests.browser.conftest import ready, sign_in
from tests.e2e.conftest import config, eid, model, route
from tests.fixtures.gateway import start_gateway
from tests.fixtures.upstream import FakeUpstream

if TYPE_CHECKING:
    from pathlib import Path

ADMIN = "adm-dashboard-inputs"
AUTH = {"authorization": f"Bearer {ADMIN}"}

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


async def test_an_emptied_weight_or_exploration_field_is_refused_and_nothing_changes(
    context: BrowserContext, tmp_path: Path
) -> None:
    a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
    gw = await start_gateway(
        config(model("m", route(a), route(b)), admin_key=ADMIN, steering={"exploration": 0.1}),
        "inproc://",
        data_dir=tmp_path,
    )
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30, headers=AUTH) as http:

            async def admin(area: str, verb: str, **args: Any) -> dict[str, Any]:
                resp = await http.post(f"/admin/{area}/{verb}", json=args)
                assert resp.status_code == 200, resp.text
                got: dict[str, Any] = resp.json()
                return got

            page = await context.new_page()
            await sign_in(page, gw.url, ADMIN)
            await page.goto(f"{gw.url}/dashboard/weights")
            await ready(page)
            endpoint = eid("m", a)
            row = page.locator(f'#weights tr[data-endpoint="{endpoint}"]')
            await row.locator("input").fill("")
            await row.locator("button.set").click()
            await expect(page.locator("#flash")).to_have_text(
                f"weight of {endpoint}: enter a number (the field is empty or holds no number)"
            )
            await expect(page.locator("#flash")).to_have_class("error")
            await expect(row.locator("input")).to_have_attribute("aria-invalid", "true")
            await expect(row.locator(".weight")).to_have_text("1")
            routes = (await admin("routing", "weights", model="m"))["models"][0]["routes"]
            assert [r["weight"] for r in routes] == [1.0, 1.0]

            await page.goto(f"{gw.url}/dashboard/chains")
            await ready(page)
            field = page.locator("#exploration [name=exploration]")
            await expect(field).to_have_value("0.1")
            await field.fill("")
            await page.locator("#exploration button").click()
            await expect(page.locator("#flash")).to_contain_text("exploration: enter a number")
            assert (await admin("steering", "get"))["exploration"] == 0.1
    finally:
        await gw.stop()
        await a.close()
        await b.close()
