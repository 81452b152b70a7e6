"""The Overview says why a route is benched as soon as it loads, from ``/health/deep`` (the
EndpointActor's own state), not only from a bench event seen live. In-process bus and NATS."""

from __future__ import annotations

import httpx
import pytest
from playwright.async_api import BrowserContext, expect

from schemas import BenchChanged, subjects
from tests.browser.conftest import sign_in
from tests.e2e.conftest import HI, config, eid, model, route, watch
from tests.fixtures.gateway import start_gateway
from tests.fixtures.upstream import FakeUpstream, Reply

ADMIN = "adm-dashboard-bench"
CALM = {"failure_threshold": 100, "cooldown_seconds": 30}  # the circuit stays closed

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@pytest.mark.parametrize("bus", ["inproc", pytest.param("nats", marks=pytest.mark.nats)])
async def test_the_overview_shows_why_a_route_is_benched_on_page_load(
    context: BrowserContext,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    bus: str,
) -> None:
    bus_url = "inproc://" if bus == "inproc" else str(request.getfixturevalue("nats_url"))
    up = await FakeUpstream("u").start()
    up.set_default(Reply(500))
    gw = await start_gateway(
        config(
            model("m", route(up)),
            circuit=CALM,
            admin_key=ADMIN,
            routing={"bench": {"failures": 1, "duration_seconds": 600}},
        ),
        bus_url,
        data_dir=tmp_path_factory.mktemp("bench"),
    )
    try:
        async with (
            watch(gw, subjects.event("bench")) as benches,
            httpx.AsyncClient(base_url=gw.url, timeout=30) as http,
        ):
            failed = await http.post("/v1/chat/completions", json={"model": "m", "messages": HI})
            assert failed.status_code >= 500
            benched = await benches.next(BenchChanged, lambda e: e.benched)
        page = await context.new_page()
        await sign_in(page, gw.url, ADMIN)  # the page loads after the event: no live event
        cell = page.locator(f'#endpoints tr[data-endpoint="{eid("m", up)}"] [data-col="bench"]')
        await expect(cell).to_contain_text(f"({benched.reason})")
        assert benched.reason == "1 failures within 900 s"
        await page.close()  # its event stream ends: the server need not wait for it to stop
    finally:
        await gw.stop()
        await up.close()
