"""The audit event of an admin command names the exchange that sent it: over HTTP (the admin
API, which the dashboard calls too) its ``request_id`` is the ``x-request-id`` of the answer
the operator got, done or refused; a command ``llmgw admin`` sends on the bus has an id of
its own, shaped as the ingress's. So an operator holding an answer finds its audit event, and
the owner's log line, by that id."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest

from gateway.admin.http import admin_request
from schemas import AdminExecuted, RouteNotFoundError, subjects
from tests.e2e.conftest import WAIT, config, gateway_bus, model, watch

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

ADMIN = "adm-audit-id"
AUTH = {"authorization": f"Bearer {ADMIN}"}
_REQUEST_ID = re.compile(r"[0-9a-f]+-[0-9a-f]{8}-[1-9][0-9]*")


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
