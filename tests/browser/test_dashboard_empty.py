"""A first day with no traffic: tables with nothing to show say so instead of staying blank
(the request log, a filter matching nothing, the limits table, a request the gateway
answered itself with no upstream attempt). In-process bus."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
from playwright.async_api import BrowserContext, expect

from tests.browser.conftest import ready, sign_in
from tests.e2e.conftest import HI, config, model, route
from tests.fixtures.gateway import start_gateway
from tests.fixtures.upstream import FakeUpstream

if TYPE_CHECKING:
    from pathlib import Path

ADMIN = "adm-dashboard-empty"
AUTH = {"authorization": f"Bearer {ADMIN}"}

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


async def test_empty_tables_say_there_is_nothing_yet(
    context: BrowserContext, tmp_path: Path
) -> None:
    up = await FakeUpstream("u").start()
    gw = await start_gateway(config(model("m", route(up)), admin_key=ADMIN), data_dir=tmp_path)
    try:
        page = await context.new_page()
        await sign_in(page, gw.url, ADMIN)
        await page.goto(f"{gw.url}/dashboard/log")
        await ready(page)
        await expect(page.locator("#log tbody tr.empty")).to_have_text("No request logged yet.")
        await page.goto(f"{gw.url}/dashboard/spend")
        await ready(page)
        await expect(page.locator("#limits tbody tr.empty")).to_contain_text(
            "has a limit of its own: set one below."
        )

        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            made = await http.post(
                "/admin/api_keys/create",
                json={"org": "o", "user": "u", "role": "pro"},
                headers=AUTH,
            )
            assert made.status_code == 200, made.text
            key = made.json()
            limit = {"subject": f"key:{key['id']}", "rpm": 1}
            assert (await http.post("/admin/limits/set", json=limit, headers=AUTH)).is_success
            codes = [
                (
                    await http.post(
                        "/v1/chat/completions",
                        json={"model": "m", "messages": HI},
                        headers={"authorization": f"Bearer {key['key']}"},
                    )
                ).status_code
                for _ in range(2)
            ]
            assert codes == [200, 429]
        await page.goto(f"{gw.url}/dashboard/log")
        await ready(page)
        await expect(page.locator("#log tbody tr.empty")).to_have_count(0)
        await page.locator('#log tr.request[data-status="429"]').click()
        await expect(page.locator("#log tr.attempts")).to_contain_text("No upstream attempt")
        await page.fill("#log-filter [name=model]", "no-such-model")
        await page.click("#log-filter button")
        await expect(page.locator("#log tbody tr.empty")).to_have_text(
            "No request matches these filters."
        )
    finally:
        await gw.stop()
        await up.close()
