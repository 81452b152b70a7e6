"""The Spend & limits page in headless chromium: a budget set from the form, a key crossing
its soft threshold and then its budget as requests are sent (shown live, from the budget
events), the spend report per key with its day in the chart's numbers, and the limit
cleared."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from playwright.async_api import BrowserContext, expect

from tests.browser.conftest import ready, screenshot, sign_in
from tests.e2e.conftest import HI, config, model, route
from tests.fixtures.gateway import start_gateway
from tests.fixtures.upstream import FakeUpstream

if TYPE_CHECKING:
    from pathlib import Path

ADMIN = "adm-dashboard-spend"
AUTH = {"authorization": f"Bearer {ADMIN}"}
PRICING = {"prompt": 2.0, "completion": 10.0}  # USD per million tokens

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


async def test_a_key_crosses_its_soft_threshold_then_its_budget_on_the_page(
    context: BrowserContext, tmp_path: Path
) -> None:
    up = await FakeUpstream("u").start()
    # A request costs 10 * 2 + 50 * 10 = 520 micro-USD; it reserves far less (max_tokens 1),
    # so the second is admitted and spends past the budget of 1000.
    up.prompt_tokens, up.completion_tokens = 10, 50
    gw = await start_gateway(
        config(model("m", route(up, pricing=PRICING)), admin_key=ADMIN),
        "inproc://",
        data_dir=tmp_path,
    )
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            made = (
                await http.post(
                    "/admin/api_keys/create",
                    json={"org": "acme", "user": "ann", "role": "pro"},
                    headers=AUTH,
                )
            ).json()
            subject = f"key:{made['id']}"

            async def chat() -> httpx.Response:
                body: dict[str, Any] = {"model": "m", "messages": HI, "max_tokens": 1}
                headers = {"authorization": f"Bearer {made['key']}"}
                return await http.post("/v1/chat/completions", json=body, headers=headers)

            page = await context.new_page()
            await sign_in(page, gw.url, ADMIN)
            await page.goto(f"{gw.url}/dashboard/spend")
            await ready(page)
            await page.wait_for_selector("body[data-live='1']", state="attached")
            form = page.locator("#set-limit")
            await form.locator("[name=subject]").fill(subject)
            await form.locator("[name=budget_usd]").fill("0.001")
            await form.locator("[name=budget_period]").select_option("day")
            await form.locator("[name=soft_fraction]").fill("0.5")
            await form.locator("button").click()
            budget = page.locator(f'#limits tr[data-subject="{subject}"] [data-axis="budget"]')
            await expect(budget).to_have_attribute("data-state", "ok")

            assert (await chat()).status_code == 200
            await expect(budget).to_have_attribute("data-state", "soft")
            await expect(budget.locator(".soft")).to_contain_text("crossed")
            assert (await chat()).status_code == 200
            await expect(budget).to_have_attribute("data-state", "exhausted")
            refused = await chat()
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "budget_exceeded"

            # The spend report by key: the key's three requests (the refused one cost
            # nothing), their day in the chart.
            await page.select_option("#spend-filter [name=group_by]", "key")
            await page.click("#spend-filter button")
            row = page.locator(f'#spend tr[data-group="{made["id"]}"]')
            await expect(row.locator("td").nth(1)).to_have_text("3")
            await expect(row.locator(".usd")).to_have_text("$0.00104")
            today = str(int(time.time() // 86_400 * 86_400))
            point = page.locator(
                f'#chart-spend table.points tr[data-ts="{today}"][data-series="{made["id"]}"]'
            )
            await expect(point.locator(".value")).to_have_text("0.00104")
            await screenshot(page, "spend")

            await page.locator(f'#limits tr[data-subject="{subject}"] button.clear').click()
            await expect(page.locator(f'#limits tr[data-subject="{subject}"]')).to_have_count(0)
            assert (await chat()).status_code == 200
    finally:
        await gw.stop()
        await up.close()
