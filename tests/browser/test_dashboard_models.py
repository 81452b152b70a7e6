"""The Models page in headless chromium: each model's routes and steering scores, the scores
moving as evidence accrues (failures lower a model's reliability, live), and a request
explained from the form drawn as the walk ``POST /admin/routing/explain`` answers."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from playwright.async_api import BrowserContext, expect

from tests.browser.conftest import ready, screenshot, sign_in
from tests.e2e.conftest import HI, config, eid, model, route
from tests.fixtures.gateway import start_gateway
from tests.fixtures.upstream import FakeUpstream, Reply

ADMIN = "adm-dashboard-models"
AUTH = {"authorization": f"Bearer {ADMIN}"}
CALM = {"failure_threshold": 100, "cooldown_seconds": 30}  # failures count, circuits stay shut

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


async def test_scores_move_with_evidence_and_explain_is_drawn_as_its_walk(
    context: BrowserContext, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ua, ub = await FakeUpstream("a").start(), await FakeUpstream("b").start()
    gw = await start_gateway(
        config(
            model("a", route(ua), catalog={"tier": 3}),
            model("b", route(ub), catalog={"tier": 2}),
            circuit=CALM,
            admin_key=ADMIN,
            steering={"exploration": 0},
            routing={"affinity": {"enabled": False}, "bench": {"failures": 100}},
        ),
        "inproc://",
        data_dir=tmp_path_factory.mktemp("models"),
    )
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            page = await context.new_page()
            await sign_in(page, gw.url, ADMIN)
            await page.goto(f"{gw.url}/dashboard/models")
            await ready(page)
            await page.wait_for_selector("body[data-live='1']", state="attached")
            card = page.locator('article[data-model="a"]')
            reliability = card.locator('[data-score="reliability"]')
            await expect(reliability).to_have_text("0.500")  # no evidence: neutral
            route_row = card.locator(f'table.routes tr[data-endpoint="{eid("a", ua)}"]')
            await expect(route_row.locator(".circuit")).to_have_text("closed")
            await expect(route_row.locator(".capacity")).to_contain_text("0 in flight")

            ua.set_default(Reply(500))
            for _ in range(3):
                failed = await http.post(
                    "/v1/chat/completions", json={"model": "a", "messages": HI}
                )
                assert failed.status_code >= 500
            # Pushed by the decision events (re-read at most every 5 s), no reload.
            await expect(reliability).not_to_have_text("0.500")
            assert float(await reliability.text_content() or "1") < 0.5
            await expect(card.locator(".evidence")).to_contain_text("3 attempts")
            await expect(route_row.locator(".availability")).not_to_have_text("100.0%")

            body: dict[str, Any] = {"model": "auto:smartest", "messages": HI}
            await page.fill("#explain textarea", json.dumps(body))
            await page.click("#explain button")
            walked = page.locator("#walk ol.walk > li")
            await expect(walked.first).to_be_visible()
            answer = (
                await http.post("/admin/routing/explain", json={"body": body}, headers=AUTH)
            ).json()
            assert (
                await walked.evaluate_all("xs => xs.map(x => x.dataset.model)") == (answer["order"])
            )
            routes = page.locator("#walk ol.walk > li:first-child ol.routes > li")
            assert await routes.evaluate_all("xs => xs.map(x => x.dataset.endpoint)") == [
                c["endpoint"] for c in answer["plan"]["candidates"]
            ]
            await screenshot(page, "models")

            # b's provider says its request limit is spent for 10 minutes: the row says so.
            spent = {
                "x-ratelimit-limit-requests": "2",
                "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": "10m0s",
            }
            ub.enqueue(Reply(headers=spent))
            answered = await http.post("/v1/chat/completions", json={"model": "b", "messages": HI})
            assert answered.status_code == 200
            b_row = page.locator(
                f'article[data-model="b"] table.routes tr[data-endpoint="{eid("b", ub)}"]'
            )
            await expect(b_row.locator(".capacity")).to_contain_text(
                "rate limit spent until", timeout=15_000
            )
    finally:
        await gw.stop()
        await ua.close()
        await ub.close()
