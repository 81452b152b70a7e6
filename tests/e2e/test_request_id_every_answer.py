"""Every answer of the ingress names its exchange with exactly one ``x-request-id``, shaped as
the request log's ids: the inference answers (whole and streamed), their refusals, and the
rest of the surface an operator or a client calls: health, metrics, the model list, the
admin API's successes and refusals, the event stream, the dashboard's redirect. Before, only
the inference answers and the errors carried one, so an operator could not find an admin
command or a health check of the logs by its answer.

And the audit event of an admin command names the exchange that sent it: over HTTP (the
admin API, which the dashboard calls too) its ``request_id`` is the ``x-request-id`` of the
answer the operator got, done or refused; a command ``llmgw admin`` sends on the bus has an
id of its own, shaped as the ingress's."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from gateway.admin.http import admin_request
from schemas import AdminExecuted, RouteNotFoundError, subjects
from tests.e2e.conftest import CHAT, WAIT, chat, config, gateway_bus, model, watch

if TYPE_CHECKING:
    import httpx

    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

ADMIN = "adm-request-id-key"
AUTH = {"authorization": f"Bearer {ADMIN}"}
_REQUEST_ID = re.compile(r"[0-9a-f]+-[0-9a-f]{8}-[1-9][0-9]*")


async def test_every_answer_carries_one_request_id_of_its_own(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await gateway_factory(config(model("m", {"kind": "echo"}), admin_key=ADMIN))
    http = gw.http()
    answers: dict[str, httpx.Response] = {
        "chat": await http.post(CHAT, json=chat("m")),
        "chat, unknown model": await http.post(CHAT, json=chat("nope")),
        "chat, not JSON": await http.post(CHAT, content=b"{"),
        "models": await http.get("/v1/models"),
        "one model": await http.get("/v1/models/m"),
        "health": await http.get("/health"),
        "ready": await http.get("/health/ready"),
        "metrics": await http.get("/metrics"),
        "admin command": await http.get("/admin/config/show", headers=AUTH),
        "admin keys": await http.get("/admin/keys", headers=AUTH),
        "routing rules": await http.get("/api/fallback/routing-rules", headers=AUTH),
        "limits": await http.get("/admin/limits", headers=AUTH),
        "admin, no key": await http.get("/admin/config/show"),
        "dashboard": await http.get("/dashboard/"),
        "no such path": await http.get("/nowhere"),
    }
    async with http.stream("POST", CHAT, json={**chat("m"), "stream": True}) as stream:
        await stream.aread()
        answers["chat, streamed"] = stream
    async with http.stream("GET", "/events", headers=AUTH) as events:
        answers["event stream"] = events

    assert {name: resp.status_code for name, resp in answers.items()} == {
        "chat": 200,
        "chat, unknown model": 404,
        "chat, not JSON": 400,
        "models": 200,
        "one model": 200,
        "health": 200,
        "ready": 200,
        "metrics": 200,
        "admin command": 200,
        "admin keys": 200,
        "routing rules": 200,
        "limits": 200,
        "admin, no key": 401,
        "dashboard": 303,
        "no such path": 404,
        "chat, streamed": 200,
        "event stream": 200,
    }
    ids = {name: resp.headers.get_list("x-request-id") for name, resp in answers.items()}
    # One each (an answer that added its own beside the exchange's would carry two) ...
    assert {name: len(found) for name, found in ids.items()} == dict.fromkeys(ids, 1), ids
    # ... shaped as every other id the ingress gives, and a different one each answer.
    assert all(_REQUEST_ID.fullmatch(found[0]) for found in ids.values()), ids
    assert len({found[0] for found in ids.values()}) == len(ids), ids


async def test_each_audit_event_names_the_request_that_sent_its_command(
    gateway_factory: GatewayFactory,
) -> None:
    gw = await gateway_factory(config(model("m", {"kind": "echo"}), admin_key=ADMIN))
    http = gw.http()
    async with watch(gw, subjects.event("admin")) as audit:
        done = await http.post(
            "/admin/chains/create", json={"name": "team", "models": ["m"]}, headers=AUTH
        )
        done_event = await audit.next(AdminExecuted, lambda e: e.area == "chains")
        refused = await http.post("/admin/chains/delete", json={"name": "nope"}, headers=AUTH)
        refused_event = await audit.next(AdminExecuted, lambda e: e.area == "chains")
        # As ``llmgw admin`` sends one: on the bus, with no HTTP exchange behind it.
        with pytest.raises(RouteNotFoundError):
            await admin_request(
                gateway_bus(gw), "chains", "delete", {"name": "nope"}, by="cli", timeout=WAIT
            )
        cli_event = await audit.next(AdminExecuted, lambda e: e.area == "chains")

    assert (done.status_code, refused.status_code) == (200, 404), (done.text, refused.text)
    assert (done_event.verb, done_event.ok) == ("create", True)
    assert (refused_event.verb, refused_event.ok) == ("delete", False)
    assert done_event.request_id == done.headers["x-request-id"]
    assert refused_event.request_id == refused.headers["x-request-id"]
    assert cli_event.by == "cli"
    assert _REQUEST_ID.fullmatch(cli_event.request_id), cli_event
    ids = {done_event.request_id, refused_event.request_id, cli_event.request_id}
    assert len(ids) == 3, ids
