"""Replay reports in the dashboard (headless chromium): a report of the folder
``dashboard.reports_dir`` names opens as its table with its plots, a report.json opened from
the operator's computer shows the same table, and no name reaches outside the folder."""

from __future__ import annotations

import struct
import zlib
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from playwright.async_api import BrowserContext, expect

from gateway.replay.report import to_json
from tests.browser.conftest import ready, screenshot, sign_in
from tests.e2e.conftest import config, model, route
from tests.fixtures.gateway import start_gateway
from tests.fixtures.upstream import FakeUpstream

if TYPE_CHECKING:
    from pathlib import Path

ADMIN = "adm-dashboard-reports"

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


def _config_summary(served: float, ttft: float, cost: float) -> dict[str, Any]:
    return {
        "requests": 100,
        "served": int(served * 100),
        "served_share": served,
        "errors": {"429": 3} if served < 1 else {},
        "cost_usd": cost,
        "ttft_mean": ttft,
        "ttft_p50": ttft,
        "ttft_p99": 2 * ttft,
        "slo_seconds": 3,
        "slo_violations": 4,
        "attempts_per_request": 1.25,
        "rate_limited_attempts": 7,
        "transitions": {"bench:benched": 2, "circuit:open": 1},
    }


REPORT: dict[str, Any] = {
    "seed": 7,
    "oracle": {"ttft_mean": 0.4, "cost_usd": 0.5},
    "configs": {
        "weighted": _config_summary(0.97, 0.8, 1.25),
        "routewise": _config_summary(1.0, 0.5, 0.75),
    },
}


def _png(width: int, height: int) -> bytes:
    """A plain white RGB PNG (what a plot file is, as far as a browser cares)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\xff" * 3 * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


async def test_a_replay_report_opens_with_its_table_and_plots(
    context: BrowserContext, tmp_path: Path
) -> None:
    folder = tmp_path / "reports" / "saturating"
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(to_json(REPORT))
    (folder / "frontier.png").write_bytes(_png(40, 30))
    (tmp_path / "secret.json").write_text("{}")
    up = await FakeUpstream("u").start()
    gw = await start_gateway(
        config(
            model("m", route(up)),
            admin_key=ADMIN,
            dashboard={"reports_dir": str(tmp_path / "reports")},
        ),
        "inproc://",
        data_dir=tmp_path,
    )
    try:
        page = await context.new_page()
        await sign_in(page, gw.url, ADMIN)
        await page.goto(f"{gw.url}/dashboard/reports")
        await ready(page)
        row = page.locator('#report-table tr[data-config="routewise"]')
        await expect(row.locator(".served")).to_have_text("100.0 %")
        await expect(row.locator(".ttft")).to_have_text("0.500 s")
        await expect(row.locator(".cost")).to_have_text("0.7500")
        await expect(page.locator("#report-table tr.oracle")).to_contain_text("0.400 s")
        plot = page.locator('#report-plots img[alt="plot frontier.png"]')
        await expect(plot).to_be_visible()
        assert await plot.evaluate("img => img.complete && img.naturalWidth") == 40
        await screenshot(page, "reports")

        # A report.json from the operator's computer: the same table, no plots.
        other = tmp_path / "mine.json"
        other.write_text(to_json({**REPORT, "configs": {"mine": REPORT["configs"]["weighted"]}}))
        await page.set_input_files("#report-upload", str(other))
        await expect(page.locator('#report-table tr[data-config="mine"] .served')).to_have_text(
            "97.0 %"
        )
        await expect(page.locator("#report-plots img")).to_have_count(0)

        # Nothing outside the folder, nor any file but a report's, can be named.
        cookie = next(c for c in await context.cookies() if c["name"] == "llmgw_dashboard")
        jar = {"cookie": f"llmgw_dashboard={cookie['value']}"}
        async with httpx.AsyncClient(base_url=gw.url, headers=jar) as http:
            good = await http.get("/dashboard/report-files/saturating/report.json")
            assert good.status_code == 200 and good.json()["seed"] == 7
            for bad in ("..%2Fsecret.json", "saturating/..%2F..%2Fsecret.json", "../secret.json"):
                resp = await http.get(f"/dashboard/report-files/{bad}")
                assert resp.status_code == 404, (bad, resp.text)
            assert (await http.get("/dashboard/report-files/saturating/x.py")).status_code == 404
    finally:
        await gw.stop()
        await up.close()
