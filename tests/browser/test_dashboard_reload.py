"""The dashboard's live events page shows a config reload by what it changed: it read
"ConfigChanged" and nothing else, and a chains event (a chain that lost models at a start)
was not listened for at all; nor were capacity, budget, limits and quota events, which its
filter did not offer either: the page now takes every kind from the server's list."""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest
import yaml
from playwright.async_api import BrowserContext, expect

from schemas import RouteCapacity, subjects
from tests.browser.conftest import ready, sign_in
from tests.e2e.conftest import config, gateway_bus, model
from tests.fixtures.gateway import start_gateway

if TYPE_CHECKING:
    from pathlib import Path

ADMIN = "adm-dashboard-reload"
pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


async def test_a_reload_reads_as_the_models_it_added_and_removed(
    context: BrowserContext, tmp_path: Path
) -> None:
    path = tmp_path / "gw.yaml"
    echo = {"kind": "echo"}
    body = config(model("a", echo), model("b", echo), admin_key=ADMIN)
    gw = await start_gateway(body, data_dir=tmp_path, config_path=path)
    try:
        page = await context.new_page()
        await sign_in(page, gw.url, ADMIN)
        await page.goto(f"{gw.url}/dashboard/events")
        await ready(page)
        await page.wait_for_selector("body[data-live='1']", state="attached")
        await page.select_option("#kind-filter", "config")
        path.write_text(yaml.safe_dump({**body, "models": [model("a", echo), model("c", echo)]}))
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            auth = {"authorization": f"Bearer {ADMIN}"}
            reloaded = await http.post("/admin/config/reload", json={}, headers=auth)
        row = page.locator('#events tr[data-kind="config"]').first
        await expect(row).to_contain_text(f"reload to {reloaded.json()['version']}: +c -b by http")
        options = await page.locator("#kind-filter option").all_inner_texts()
        # A kind the page once neither offered nor listened for (a named server-sent event
        # nobody listens for is never delivered): every kind is both.
        await page.select_option("#kind-filter", "")
        learned = RouteCapacity(
            model="a", endpoint="a:echo", limit=3.0, in_flight=3, reason="rate_limited", ts=1.0
        )
        await gateway_bus(gw).publish(subjects.event("capacity"), learned)
        capacity = page.locator('#events tr[data-kind="capacity"]').first
        await expect(capacity).to_contain_text("a:echo limit 3.0, 3 in flight")
    finally:
        await gw.stop()

    assert reloaded.status_code == 200, reloaded.text
    assert options == ["all", *subjects.EVENT_KINDS]
