"""The overview's charts in headless chromium, from a scripted scenario: requests served,
then failures injected at a known time that open the circuit. The errors appear in the
bucket of that time (per model and per endpoint, over the hour and the day), and the
circuit's interval, from the kept events, is listed and shaded where its events put it."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import httpx
import pytest
from playwright.async_api import BrowserContext, Page, expect

from schemas import CircuitTransition
from tests.browser.conftest import screenshot, sign_in
from tests.e2e.conftest import HI, STAYS_OPEN, circuit_events, config, eid, model, route
from tests.fixtures.gateway import start_gateway
from tests.fixtures.upstream import FakeUpstream, Reply

if TYPE_CHECKING:
    from playwright.async_api import Locator

ADMIN = "adm-dashboard-charts"

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

_PIXEL = """(f, ts) => {
    const u = f.chart;
    const x = Math.round(u.valToPos(ts, "x", true)) + 1;
    return [...u.ctx.getImageData(x, Math.round(u.bbox.top) + 2, 1, 1).data];
}"""


async def _errors_by_bucket(table: Locator, series: str) -> dict[float, int]:
    rows = table.locator(f'tr[data-series="{series}"]')
    pairs = await rows.evaluate_all(
        "rows => rows.map(r => [Number(r.dataset.ts), Number(r.cells[2].textContent)])"
    )
    return {ts: n for ts, n in pairs}


async def _until_errors(page: Page, series: str, span: int, total: int) -> dict[float, int]:
    """The errors chart's numbers of ``series`` once it shows ``span`` seconds and
    ``total`` errors (the page re-reads the aggregates on its own: after a control changes,
    and after the circuit event it replays at load)."""
    await page.wait_for_function(
        """([series, span, total]) => {
            const f = document.getElementById("chart-errors");
            const rows = f.querySelectorAll(`table.points tr[data-series="${series}"]`);
            const sum = [...rows].reduce((n, r) => n + Number(r.cells[2].textContent), 0);
            return Number(f.dataset.to) - Number(f.dataset.from) === span && sum === total;
        }""",
        arg=[series, span, total],
    )
    return await _errors_by_bucket(page.locator("#chart-errors table.points"), series)


async def test_errors_and_a_circuit_interval_are_drawn_at_the_time_they_happened(
    context: BrowserContext, tmp_path_factory: pytest.TempPathFactory
) -> None:
    up = await FakeUpstream("u").start()
    gw = await start_gateway(
        config(model("m", route(up)), circuit=STAYS_OPEN, admin_key=ADMIN),
        "inproc://",
        data_dir=tmp_path_factory.mktemp("charts"),
    )
    endpoint = eid("m", up)
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            for _ in range(3):  # streamed: a first token has a time
                ok = await http.post(
                    "/v1/chat/completions", json={"model": "m", "messages": HI, "stream": True}
                )
                assert ok.status_code == 200 and "[DONE]" in ok.text
            up.set_default(Reply(500))
            async with circuit_events(gw) as circuits:
                before = time.time()
                for _ in range(2):  # STAYS_OPEN: two failures open it for 30 s
                    failed = await http.post(
                        "/v1/chat/completions", json={"model": "m", "messages": HI}
                    )
                    assert failed.status_code >= 500
                opened = await circuits.next(CircuitTransition, lambda e: e.new == "open")
                after = time.time()
        page = await context.new_page()
        await sign_in(page, gw.url, ADMIN)

        # The interval, from the kept circuit event, listed where the event puts it...
        interval = page.locator('#intervals li[data-kind="circuit"]')
        await expect(interval).to_have_count(1)
        start = float(await interval.get_attribute("data-start") or 0)
        assert start == opened.ts and before <= start <= after
        await expect(interval).to_contain_text(endpoint)
        # ... and shaded there on every chart (the circuit band's red), not before it.
        for name in ("requests", "errors", "ttft"):
            figure = page.locator(f"#chart-{name}")
            r, g, _, alpha = await figure.evaluate(_PIXEL, start)
            assert alpha > 0 and r > g, (name, r, g, alpha)
            r, g, _, alpha = await figure.evaluate(_PIXEL, start - 900)
            # Not red there: a grid line (grey) may cross that pixel when the axis' ticks do.
            assert alpha == 0 or r <= g, (name, r, g, alpha)

        # The two errors in the minute they were sent, overall and for the endpoint.
        minutes = {before - before % 60, after - after % 60}
        by_minute = await _until_errors(page, "all", 3600, 2)
        assert set(by_minute) <= minutes, (by_minute, minutes)
        ttft = page.locator('#chart-ttft table.points tr[data-series="all p50"]')
        await expect(ttft.first).to_be_attached()
        await screenshot(page, "overview-charts")

        await page.select_option("#chart-controls [name=by]", "endpoint")
        assert set(await _until_errors(page, endpoint, 3600, 2)) <= minutes
        # The day, in quarter hours: the same two errors in the quarter of their minute.
        await page.select_option("#chart-controls [name=range]", "day")
        by_quarter = await _until_errors(page, "all", 96 * 900, 2)
        assert set(by_quarter) <= {b - b % 900 for b in minutes}, by_quarter
        await page.close()
    finally:
        await gw.stop()
        await up.close()
