"""The dashboard stays cheap however large the log and however busy the bus: with 100,000
rows in the request log (written into its SQLite file before the gateway starts) and 50
events a second on the bus, each page load makes a bounded number of requests (counted in
the browser), the overview's rates come from the log owner's aggregates, and the events page
keeps a bounded table and stays responsive when paused."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio
from playwright.async_api import BrowserContext, Page, expect

from actors.stores.request_log import INSERT, REQUEST_LOG, missing_columns
from schemas import RouteDecided, subjects
from tests.browser.conftest import ready, screenshot, sign_in
from tests.e2e.conftest import config, gateway_bus, model, route
from tests.fixtures.gateway import RunningGateway, start_gateway
from tests.fixtures.upstream import FakeUpstream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

ADMIN = "adm-dashboard-load"
ROWS = 100_000
RECENT = 5_000  # of them in the last hour: what the aggregates are seeded with
MAX_REQUESTS = 10  # per page load: page, stylesheet, script, data, one event stream
EVENTS_PER_SECOND = 50
PAGES = (
    "overview",
    "events",
    "chains",
    "models",
    "rules",
    "weights",
    "keys",
    "spend",
    "log",
    "reports",
)
UNSTREAMED = ("/log", "/reports")  # the pages that open no event stream


def _fill_log(path: Path, endpoint: str) -> None:
    """Write ROWS request-log rows (half requests, half attempts) over the last ten days."""
    now = time.time()
    db = sqlite3.connect(path)
    for stmt in REQUEST_LOG.statements:
        db.execute(stmt)
    for stmt in missing_columns(set()):  # the columns added since (cost, key, user)
        db.execute(stmt)

    def rows() -> object:
        for i in range(ROWS // 2):
            ts = now - 3000 * i / RECENT if i < RECENT // 2 else now - 3600 - i * 17.0
            failed = i % 10 == 0
            rid = f"bulk-{i}"
            yield (
                ts,
                "request",
                rid,
                "c-0123456789ab",
                "acme",
                "chat",
                "m",
                "m",
                endpoint,
                "",
                502 if failed else 200,
                "error" if failed else "success",
                "",
                0,
                1,
                120.0 + i % 50,
                300.0,
                10,
                20,
                0,
                0,
                0.0,
                0,
                "key-1",
                "ann",
                "",
            )
            yield (
                ts,
                "attempt",
                rid,
                "c-0123456789ab",
                "",
                "chat",
                "",
                "m",
                endpoint,
                "",
                502 if failed else 200,
                "failure" if failed else "success",
                "",
                0,
                1,
                120.0 + i % 50,
                290.0,
                10,
                20,
                0,
                0,
                0.0,
                0,
                "key-1",
                "ann",
                "",
            )

    db.executemany(INSERT, rows())  # type: ignore[arg-type]
    db.commit()
    db.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningGateway]:
    up = await FakeUpstream("m").start()
    data = tmp_path_factory.mktemp("load")
    db = data / "llmgw.sqlite3"
    await asyncio.to_thread(_fill_log, db, f"m:local-{up.port}")
    gw = await start_gateway(
        config(model("m", route(up)), admin_key=ADMIN, database={"path": str(db)}), "inproc://"
    )
    yield gw
    await gw.stop()
    await up.close()


@pytest_asyncio.fixture(loop_scope="module")
async def busy(gw: RunningGateway) -> AsyncIterator[None]:
    """50 decision events a second on the gateway's bus while the test runs."""
    bus = gateway_bus(gw)

    async def publish() -> None:
        n = 0
        while True:  # a load generator: the pace is the point, nothing waits on it
            n += 1
            await bus.publish(
                subjects.event("decision"),
                RouteDecided(
                    request_id=f"load-{n}",
                    model="m",
                    requested_model="m",
                    reason="weighted",
                    served="m",
                    attempts=1,
                    status=200,
                    ts=time.time(),
                ),
            )
            await asyncio.sleep(1 / EVENTS_PER_SECOND)  # the load's pace, not a wait

    task = asyncio.create_task(publish())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _load(page: Page, url: str) -> list[str]:
    """Open ``url``; the requests the page made until it was filled (and live)."""
    made: list[str] = []
    page.on("request", lambda r: made.append(r.url))
    await page.goto(url)
    await ready(page)
    if not url.endswith(UNSTREAMED):
        await page.wait_for_selector("body[data-live='1']", state="attached")
    return made


async def test_each_page_load_makes_a_bounded_number_of_requests(
    context: BrowserContext, gw: RunningGateway, busy: None
) -> None:
    page = await context.new_page()
    await sign_in(page, gw.url, ADMIN)
    for name in PAGES:
        fresh = await context.new_page()
        made = await _load(fresh, f"{gw.url}/dashboard/{name}")
        assert len(made) <= MAX_REQUESTS, (name, made)
        streams = [u for u in made if "/dashboard/api/events" in u]
        assert len(streams) <= 1, (name, made)
        await fresh.close()

    made = await _load(page, f"{gw.url}/dashboard/overview")
    # Rates from the aggregates the log owner seeded from the file's last hour.
    rpm = page.locator("#rpm")
    await expect(rpm).not_to_have_text("…")
    assert float(await rpm.text_content() or "0") > 0
    await expect(page.locator("#p50")).to_contain_text("ms")

    await _load(page, f"{gw.url}/dashboard/log")
    await expect(page.locator("#log tr.request")).to_have_count(50)


async def test_the_events_page_stays_bounded_and_responsive_at_50_per_second(
    context: BrowserContext, gw: RunningGateway, busy: None
) -> None:
    page = await context.new_page()
    await sign_in(page, gw.url, ADMIN)
    await _load(page, f"{gw.url}/dashboard/events")
    rows = page.locator("#events tbody tr")
    await expect(rows.nth(24)).to_be_attached()
    await screenshot(page, "events-busy")
    await page.click("#pause")
    shown = await rows.count()
    # Paused under load: the page still answers at once and the table does not grow.
    await page.fill("#model-filter", "m")
    assert await rows.count() == shown
    await page.fill("#model-filter", "")
    await page.click("#pause")
    if shown < 500:
        await expect(rows.nth(shown)).to_be_attached()
    assert await rows.count() <= 500
