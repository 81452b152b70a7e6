"""The Spend & limits page follows a subject's requests per minute as they happen, up to the
limit and the refusals there: no event says that a request was counted or refused at its
rpm, or that the minute's window slid, so the page re-reads ``limits/usage`` every 10 s
while shown (the browser's clock is driven here). In-process bus."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx
import pytest
from playwright.async_api import BrowserContext, expect

from tests.browser.conftest import ready, sign_in
from tests.e2e.conftest import HI, config, model, route
from tests.fixtures.gateway import start_gateway
from tests.fixtures.upstream import FakeUpstream

if TYPE_CHECKING:
    from pathlib import Path

ADMIN = "adm-dashboard-usage"
AUTH = {"authorization": f"Bearer {ADMIN}"}

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


async def test_the_limits_table_follows_requests_up_to_the_rpm_and_its_refusals(
    context: BrowserContext, tmp_path: Path
) -> None:
    up = await FakeUpstream("u").start()
    gw = await start_gateway(config(model("m", route(up)), admin_key=ADMIN), data_dir=tmp_path)
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:

            async def admin(area: str, verb: str, **args: Any) -> dict[str, Any]:
                resp = await http.post(f"/admin/{area}/{verb}", json=args, headers=AUTH)
                assert resp.status_code == 200, resp.text
                got: dict[str, Any] = resp.json()
                return got

            made = await admin("api_keys", "create", org="acme", user="ann", role="pro")
            subject = f"key:{made['id']}"
            await admin("limits", "set", subject=subject, rpm=2)
            page = await context.new_page()
            await sign_in(page, gw.url, ADMIN)
            await page.clock.install()
            await page.goto(f"{gw.url}/dashboard/spend")
            await ready(page)
            rpm = page.locator(f'#limits tr[data-subject="{subject}"] [data-axis="rpm"]')
            await expect(rpm).to_have_text("0 / 2 (0%)")

            statuses = []
            for _ in range(3):
                body = {"model": "m", "messages": HI}
                headers = {"authorization": f"Bearer {made['key']}"}
                resp = await http.post("/v1/chat/completions", json=body, headers=headers)
                statuses.append(resp.status_code)
            assert statuses == [200, 200, 429]
            await page.clock.run_for(10_000)
            await expect(rpm).to_have_text("2 / 2 (100%)")
    finally:
        await gw.stop()
        await up.close()
