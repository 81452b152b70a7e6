"""The dashboard's API (``/dashboard/api/*``) through the real server: every answer, JSON and
errors included, carries ``no-store``, ``nosniff`` and the CSP; PATCH reaches its admin route;
limit and RouteWise changes are audited as the dashboard's admin like every other command.

Plain HTTP (no browser): what is proven here is the server's answer to each request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx
import pytest

from schemas import AdminExecuted, subjects
from tests.e2e.conftest import WAIT, watch
from tests.e2e.test_dashboard_sessions import ADMIN, _cfg, sign_in

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e


@pytest.fixture
async def gw(gateway_factory: GatewayFactory, fake_upstream: FakeUpstream) -> RunningGateway:
    """A gateway with model ``m``, a chain ``team`` and the admin key."""
    return await gateway_factory(_cfg(fake_upstream))


def _assert_locked_down(resp: httpx.Response) -> None:
    assert resp.headers.get("cache-control") == "no-store", resp.headers
    assert resp.headers.get("x-content-type-options") == "nosniff", resp.headers
    assert "default-src 'self'" in resp.headers.get("content-security-policy", ""), resp.headers
    assert "frame-ancestors 'none'" in resp.headers["content-security-policy"]


async def test_every_dashboard_api_answer_is_not_stored_not_sniffed_and_has_a_csp(
    gw: RunningGateway,
) -> None:
    session = await sign_in(gw, ADMIN)
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as http:
        listed = await http.get("/dashboard/api/admin/chains/list", headers=session.headers())
        new_key = await http.post(
            "/dashboard/api/admin/keys",
            json={"org": "ops", "user": "bo", "role": "free"},
            headers=session.headers(),
        )
        missing = await http.get("/dashboard/api/admin/nope/show", headers=session.headers())
        no_session = await http.get("/dashboard/api/admin/chains/list")

    assert listed.status_code == 200 and new_key.status_code == 201, new_key.text
    assert new_key.json()["key"].startswith("llmgw-")  # the once-shown key
    assert missing.status_code == 404 and no_session.status_code == 401
    for resp in (listed, new_key, missing, no_session):
        _assert_locked_down(resp)
        assert resp.headers["content-type"].startswith("application/json")


async def test_patch_through_the_dashboard_api_reaches_its_admin_route(
    gw: RunningGateway,
) -> None:
    session = await sign_in(gw, ADMIN)
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as http:
        patched = await http.patch(
            "/dashboard/api/admin/routewise/settings",
            json={"budget_alpha": 0.25},
            headers=session.headers(),
        )
        shown = await http.get("/dashboard/api/admin/routewise/settings", headers=session.headers())

    assert patched.status_code == 200, patched.text
    assert shown.json()["settings"]["budget_alpha"] == 0.25, shown.text
    _assert_locked_down(patched)


async def test_limit_and_routewise_changes_from_the_dashboard_are_audited_as_its_admin(
    gw: RunningGateway,
) -> None:
    session = await sign_in(gw, ADMIN)
    async with watch(gw, subjects.event("admin")) as audit:
        async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as http:
            limit = await http.put(
                "/dashboard/api/admin/limits/org/acme", json={"rpm": 5}, headers=session.headers()
            )
            assert limit.status_code == 200, limit.text
            limit_set = await audit.next(AdminExecuted, lambda e: e.area == "limits")
            routewise = await http.patch(
                "/dashboard/api/admin/routewise/settings",
                json={"budget_alpha": 0.5},
                headers=session.headers(),
            )
            assert routewise.status_code == 200, routewise.text
            routewise_set = await audit.next(AdminExecuted, lambda e: e.area == "routewise")

    assert limit_set.by == routewise_set.by == "dashboard:bootstrap-admin"


async def test_the_dashboard_forwards_the_admin_path_it_checked_never_another(
    gw: RunningGateway,
) -> None:
    # ``/dashboard/api%2Fadmin%2Fkeys/admin/chains/list`` decodes to an admin path under
    # ``/admin/keys`` (the one the dashboard checks), but its raw form, split after the API's
    # prefix, dropped its first segment and ran ``/admin/chains/list``: a path the checks
    # (``/admin/dashboard`` refused, say) never saw.
    session = await sign_in(gw, ADMIN)
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as http:
        smuggled = await http.get(
            "/dashboard/api%2Fadmin%2Fkeys/admin/chains/list", headers=session.headers()
        )
        listed = await http.get("/dashboard/api/admin/chains/list", headers=session.headers())
        escaped = await http.get(
            "/dashboard/api/admin/limits/user/acme%2Fbob", headers=session.headers()
        )

    assert smuggled.status_code == 404, smuggled.text
    assert listed.status_code == 200, listed.text
    assert escaped.status_code == 200 and escaped.json()["subject"] == "user:acme/bob"
    _assert_locked_down(smuggled)
