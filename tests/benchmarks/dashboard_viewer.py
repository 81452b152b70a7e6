"""A dashboard left open in headless chromium while the benchmark runs (``bench.py
--dashboard PAGE``): it signs in with the admin key, opens PAGE (its charts, its event stream)
and stays until it is terminated, so the rows measure ``/v1`` with an operator watching.

    python -m tests.benchmarks.dashboard_viewer URL ADMIN_KEY PAGE
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys

from playwright.async_api import async_playwright

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


async def view(url: str, key: str, page_name: str) -> None:
    """Open ``page_name`` signed in as ``key``; return when SIGTERM or SIGINT arrives."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        page = await browser.new_page(viewport={"width": 1360, "height": 900})
        await page.goto(f"{url}/dashboard")
        await page.fill("#key", key)
        await page.click("button[type=submit]")
        await page.wait_for_url("**/dashboard/overview")
        if page_name != "overview":
            await page.goto(f"{url}/dashboard/{page_name}")
        await page.wait_for_selector("body[data-ready='1']", state="attached")
        print(f"dashboard open: {page.url}", flush=True)
        await stop.wait()
        await browser.close()


def main(argv: list[str]) -> int:
    url, key, page_name = argv
    asyncio.run(view(url, key, page_name))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
