"""Dashboard sessions across ingresses (in-process bus; on NATS a second ``--role ingress``):
the sign-in form's CSRF token, sign-out ending the session on every ingress, a session ending
with the admin key it was signed in with, and dashboard commands audited as its admin.

Plain HTTP (no browser): what is proven here is the server's answer to each request.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from schemas import AdminExecuted, ApiKeyRevoked, DashboardSessionEnded, subjects
from tests.e2e.conftest import WAIT, config, model, route, watch

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = pytest.mark.e2e

ADMIN = "adm-sessions"
AUTH = {"authorization": f"Bearer {ADMIN}"}
CHAINS = "/dashboard/api/admin/chains/list"


class Signed:
    """A dashboard session: its cookie header and the CSRF token its pages carry."""

    def __init__(self, cookie: str, csrf: str) -> None:
        self.cookie = cookie
        self.csrf = csrf

    def headers(self) -> dict[str, str]:
        return {"cookie": f"llmgw_dashboard={self.cookie}", "x-csrf-token": self.csrf}


def _form_token(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)


async def sign_in(gw: RunningGateway, key: str) -> Signed:
    """Sign in through the form, as a browser does (the form's cookie and token)."""
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as http:
        form = await http.get("/dashboard/signin")
        resp = await http.post("/dashboard/signin", data={"key": key, "csrf": _form_token(form)})
        assert resp.status_code == 303, resp.text
        cookie = resp.cookies["llmgw_dashboard"]
        page = await http.get(
            "/dashboard/overview", headers={"cookie": f"llmgw_dashboard={cookie}"}
        )
    found = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
    assert found, page.text
    return Signed(cookie, found.group(1))


async def _status(gw: RunningGateway, session: Signed, path: str = CHAINS) -> int:
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as http:
        return (await http.get(path, headers=session.headers())).status_code


def _cfg(up: FakeUpstream) -> dict[str, Any]:
    return config(
        model("m", route(up)), admin_key=ADMIN, chains=[{"name": "team", "models": ["m"]}]
    )


async def _two_ingresses(
    gateway_factory: GatewayFactory, up: FakeUpstream, bus_url: str
) -> tuple[RunningGateway, RunningGateway]:
    """The gateway, and a second ingress on its bus (NATS; on the in-process bus the same)."""
    gw = await gateway_factory(_cfg(up))
    other = await gateway_factory(_cfg(up), role="ingress") if bus_url.startswith("nats") else gw
    return gw, other


async def test_a_sign_in_without_its_form_token_is_refused(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    gw = await gateway_factory(_cfg(fake_upstream))
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as http:
        bare = await http.post("/dashboard/signin", data={"key": ADMIN})
        forged = await http.post("/dashboard/signin", data={"key": ADMIN, "csrf": "x"})
        form = await http.get("/dashboard/signin")
        token = _form_token(form)
        assert "llmgw_signin" in form.headers["set-cookie"]
        assert "SameSite=Strict" in form.headers["set-cookie"]
    # The token without its cookie (another site's form, posted cross-site) is no better.
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as fresh:
        cookieless = await fresh.post("/dashboard/signin", data={"key": ADMIN, "csrf": token})
    for resp in (bare, forged, cookieless):
        assert resp.status_code == 403, resp.text
        assert "llmgw_dashboard=" not in resp.headers.get("set-cookie", "")
        assert "sign-in form" in resp.text and ADMIN not in resp.text
    assert await _status(gw, await sign_in(gw, ADMIN)) == 200


async def test_a_token_that_is_not_ascii_is_refused_not_a_500(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    # hmac.compare_digest refuses text that is not ASCII: anyone, signed in or not, got a 500
    # and a logged traceback with one accented letter.
    gw = await gateway_factory(_cfg(fake_upstream))
    session = await sign_in(gw, ADMIN)
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as http:
        signin = await http.post(
            "/dashboard/signin",
            content=b"key=x&csrf=%C3%A9",
            headers={
                "cookie": "llmgw_signin=anything",
                "content-type": "application/x-www-form-urlencoded",
            },
        )
        raw = [
            (b"cookie", f"llmgw_dashboard={session.cookie}".encode()),
            (b"x-csrf-token", "\u00e9".encode()),  # its UTF-8 bytes, as a client sends them
        ]
        command = await http.post(CHAINS, headers=raw)

    assert signin.status_code == 403, signin.text
    assert command.status_code == 403, command.text


async def test_sign_out_ends_the_session_on_every_ingress(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    bus_url: str,
) -> None:
    gw, other = await _two_ingresses(gateway_factory, fake_upstream, bus_url)
    session, kept = await sign_in(gw, ADMIN), await sign_in(gw, ADMIN)
    assert await _status(other, session) == 200  # any ingress accepts it

    async with watch(other, subjects.DASHBOARD_SESSION_ENDED) as ended:
        async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as http:
            out = await http.post(
                "/dashboard/signout",
                data={"csrf": session.csrf},
                headers={"cookie": f"llmgw_dashboard={session.cookie}"},
            )
        assert out.status_code == 303, out.text
        announced = await ended.next(DashboardSessionEnded)
    assert session.cookie not in repr(announced)  # the id only, never the token

    assert await _status(gw, session) == 401
    assert await _status(other, session) == 401
    assert await _status(other, kept) == 200  # only that session


async def test_revoking_the_admin_key_of_a_session_ends_it_and_commands_are_audited_as_it(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    bus_url: str,
) -> None:
    gw, other = await _two_ingresses(gateway_factory, fake_upstream, bus_url)
    async with gw.http(headers=AUTH) as admin:
        made = (
            await admin.post(
                "/admin/api_keys/create", json={"org": "ops", "user": "ann", "role": "admin"}
            )
        ).json()
    session = await sign_in(gw, made["key"])
    bootstrap = await sign_in(gw, ADMIN)
    assert made["key"] not in session.cookie

    async with watch(gw, subjects.event("admin")) as audit:
        async with httpx.AsyncClient(base_url=other.url, timeout=WAIT) as http:
            resp = await http.post(
                "/dashboard/api/admin/steering/set_exploration",
                json={"exploration": 0},
                headers=session.headers(),
            )
        assert resp.status_code == 200, resp.text
        executed = await audit.next(AdminExecuted, lambda e: e.verb == "set_exploration")
        async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as http:
            resp = await http.post(
                "/dashboard/api/admin/keys",
                headers=session.headers(),
                json={"org": "ops", "user": "bo", "role": "free"},
            )
        assert resp.status_code == 201, resp.text
        created = await audit.next(AdminExecuted, lambda e: e.verb == "create")
    assert executed.by == created.by == f"dashboard:{made['id']}"

    assert await _status(other, session) == 200  # cached on that ingress now
    async with watch(other, subjects.AUTH_KEYS_CHANGED) as changed:
        async with gw.http(headers=AUTH) as admin:
            revoked = await admin.post("/admin/api_keys/revoke", json={"id": made["id"]})
            assert revoked.status_code == 200, revoked.text
        await changed.next(ApiKeyRevoked)
    for ingress in {id(gw): gw, id(other): other}.values():
        assert await _status(ingress, session) == 401
        async with httpx.AsyncClient(base_url=ingress.url, timeout=WAIT) as http:
            page = await http.get("/dashboard/overview", headers=session.headers())
        assert page.status_code == 303
        assert page.headers["location"] == "/dashboard/signin?next=overview"
        assert await _status(ingress, bootstrap) == 200  # the configured admin_key's holds


@pytest.mark.parametrize(
    "proxy", [{"x-forwarded-proto": "https"}, {"forwarded": "for=10.0.0.1;proto=https"}]
)
async def test_behind_a_tls_proxy_every_dashboard_cookie_is_secure(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, proxy: dict[str, str]
) -> None:
    gw = await gateway_factory(_cfg(fake_upstream))
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT, headers=proxy) as http:
        form = await http.get("/dashboard/signin")
        assert "; Secure" in form.headers["set-cookie"]
        # httpx, as a browser would, sends no Secure cookie to this http:// URL: sent by hand.
        nonce = form.headers["set-cookie"].split(";", 1)[0]
        resp = await http.post(
            "/dashboard/signin",
            data={"key": ADMIN, "csrf": _form_token(form)},
            headers={"cookie": nonce},
        )
        assert resp.status_code == 303, resp.text
        assert "; Secure" in resp.headers["set-cookie"]
        jar = {"cookie": resp.headers["set-cookie"].split(";", 1)[0]}
        page = await http.get("/dashboard/overview", headers=jar)
        out = await http.post("/dashboard/signout", data={"csrf": _form_token(page)}, headers=jar)
        assert out.status_code == 303 and "; Secure" in out.headers["set-cookie"]
    async with httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as plain:
        assert "Secure" not in (await plain.get("/dashboard/signin")).headers["set-cookie"]
