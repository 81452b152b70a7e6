"""A session that ends while a page is open (signed out in another tab, expired, its admin
key revoked): the page sends the operator to sign in again, and back to the page they were
on, instead of staying stale with a "needs a session" error under every button. In-process
bus."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import httpx
import pytest
from playwright.async_api import BrowserContext, expect

from tests.browser.conftest import ready, sign_in
from tests.e2e.conftest import config, model, route
from tests.fixtures.gateway import start_gateway
from tests.fixtures.upstream import FakeUpstream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from tests.fixtures.gateway import RunningGateway

ADMIN = "adm-dashboard-session"

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]


@contextlib.asynccontextmanager
async def _gateway(tmp_path: Path, routes: int = 1) -> AsyncIterator[RunningGateway]:
    """A gateway with the bootstrap admin key and one model of ``routes`` routes to one fake
    upstream, on the in-process bus; both stopped on leaving."""
    up = await FakeUpstream("u").start()
    gw = await start_gateway(
        config(model("m", *[route(up)] * routes), admin_key=ADMIN), "inproc://", data_dir=tmp_path
    )
    try:
        yield gw
    finally:
        await gw.stop()
        await up.close()


async def test_a_page_whose_session_ended_goes_to_sign_in_and_back_to_that_page(
    context: BrowserContext, tmp_path: Path
) -> None:
    async with _gateway(tmp_path, routes=2) as gw:
        page = await context.new_page()
        await sign_in(page, gw.url, ADMIN)
        await page.goto(f"{gw.url}/dashboard/weights")
        await ready(page)
        await page.wait_for_selector("body[data-live='1']", state="attached")

        other = await context.new_page()  # another tab of the same browser signs out
        await other.goto(f"{gw.url}/dashboard/overview")
        await other.click("#signout")
        await expect(other).to_have_url(f"{gw.url}/dashboard/signin")
        await other.close()

        await page.locator("#weights tbody tr button.set").first.click()
        await expect(page).to_have_url(f"{gw.url}/dashboard/signin?next=weights")
        await page.fill("#key", ADMIN)
        await page.click("button[type=submit]")
        await expect(page).to_have_url(f"{gw.url}/dashboard/weights")
        await ready(page)
        await expect(page.locator("#flash")).to_be_empty()

        # "next" names a page, never a URL: anything else goes to the overview.
        await page.click("#signout")
        await page.goto(f"{gw.url}/dashboard/signin?next=//evil.example/")
        await page.fill("#key", ADMIN)
        await page.click("button[type=submit]")
        await expect(page).to_have_url(f"{gw.url}/dashboard/overview")


async def test_an_open_event_stream_ends_with_its_session(
    context: BrowserContext, tmp_path: Path
) -> None:
    async with _gateway(tmp_path) as gw:
        page = await context.new_page()
        await sign_in(page, gw.url, ADMIN)
        await page.goto(f"{gw.url}/dashboard/events")
        await ready(page)
        await page.wait_for_selector("body[data-live='1']", state="attached")

        other = await context.new_page()
        await other.goto(f"{gw.url}/dashboard/overview")
        await other.click("#signout")
        await expect(other).to_have_url(f"{gw.url}/dashboard/signin")
        await other.close()

        # An event after the sign-out: the stream, opened while the session was on, ends
        # instead of carrying it, and the page goes to sign in.
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:
            made = await http.post(
                "/admin/chains/create",
                json={"name": "after", "models": ["m"]},
                headers={"authorization": f"Bearer {ADMIN}"},
            )
            assert made.status_code == 200, made.text
        await expect(page).to_have_url(f"{gw.url}/dashboard/signin?next=events")


async def test_a_401_about_another_key_leaves_the_operator_on_the_page(
    context: BrowserContext, tmp_path: Path
) -> None:
    async with _gateway(tmp_path) as gw:
        page = await context.new_page()
        await sign_in(page, gw.url, ADMIN)
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as http:  # auth on
            made = await http.post(
                "/admin/api_keys/create",
                json={"org": "o", "user": "u", "role": "pro"},
                headers={"authorization": f"Bearer {ADMIN}"},
            )
            assert made.status_code == 200, made.text
        await page.goto(f"{gw.url}/dashboard/models")
        await ready(page)
        # Explain as a caller whose key is unknown: the admin call answers 401 about that key,
        # not about the session.
        await page.fill("#explain [name=caller]", "not-a-key")
        await page.click("#explain button[type=submit]")
        await expect(page.locator("#walk .error")).to_have_text("invalid API key")
        await expect(page).to_have_url(f"{gw.url}/dashboard/models")
