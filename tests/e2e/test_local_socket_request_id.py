"""Every answer of the local admin socket carries an ``x-request-id`` made as the ingress makes
its own (``<pid, hex>-<8 random hex digits>-<count>``): a command's answer, each kind of error,
the event stream; a different one each answer, so an operator can tell the commands apart in
the gateway's logs. Through the socket a gateway serving in this loop opened beside its
database."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.e2e.conftest import CHAT, WAIT, chat

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

_REQUEST_ID = re.compile(r"(?P<pid>[0-9a-f]+)-[0-9a-f]{8}-[1-9][0-9]*")
_ECHO = {"models": [{"id": "m", "route": [{"kind": "echo"}]}]}


def _pid_of(request_id: str | None) -> str:
    """The process part of an ``x-request-id``. Fails the test when it has not the shape."""
    match = _REQUEST_ID.fullmatch(request_id or "")
    assert match is not None, request_id
    return match["pid"]


async def test_every_socket_answer_carries_its_own_request_id_shaped_as_the_ingress_s(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    gw = await gateway_factory(_ECHO)  # its database, and so its socket, in tmp_path
    over_http = await gw.http().post(CHAT, json=chat("m"))
    transport = httpx.AsyncHTTPTransport(uds=str(tmp_path / "llmgw.sqlite3.sock"))
    async with httpx.AsyncClient(
        base_url="http://llmgw", transport=transport, timeout=WAIT
    ) as local:
        answers = {
            "command": await local.get("/admin/config/show"),
            "no such path": await local.get("/nowhere"),
            "no such area": await local.post("/admin/nowhere/show", json={}),
            "arguments not an object": await local.post("/admin/config/show", content=b"[1]"),
        }
        async with local.stream("GET", "/events") as events:
            answers["event stream"] = events
    ids = {name: resp.headers.get("x-request-id") for name, resp in answers.items()}

    assert over_http.status_code == 200, over_http.text
    assert {name: resp.status_code for name, resp in answers.items()} == {
        "command": 200,
        "no such path": 404,
        "no such area": 404,
        "arguments not an object": 400,
        "event stream": 200,
    }
    # The same process answered on both: the same pid leads both ids.
    assert {name: _pid_of(rid) for name, rid in ids.items()} == dict.fromkeys(
        ids, _pid_of(over_http.headers.get("x-request-id"))
    )
    assert len(set(ids.values())) == len(ids), ids
    assert over_http.headers["x-request-id"] not in ids.values()
    # Errors in the HTTP admin API's shape (they had no type and no param).
    refused = answers["arguments not an object"].json()["error"]
    assert refused["type"] == "invalid_request_error" and "param" in refused, refused
    assert answers["no such path"].json()["error"]["type"] == "not_found_error"


async def test_a_change_sent_with_get_over_the_socket_is_refused_and_changes_nothing(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    """``GET /admin/chains/delete?name=...`` deleted the chain over the socket, which the
    HTTP API refuses: a GET is what a client or a tool may send again."""
    await gateway_factory(_ECHO)
    transport = httpx.AsyncHTTPTransport(uds=str(tmp_path / "llmgw.sqlite3.sock"))
    async with httpx.AsyncClient(
        base_url="http://llmgw", transport=transport, timeout=WAIT
    ) as local:
        made = await local.post("/admin/chains/create", json={"name": "c", "models": ["m"]})
        deleted = await local.get("/admin/chains/delete", params={"name": "c"})
        pruned = await local.get("/admin/log/prune")
        listed = await local.get("/admin/chains/list")  # a read: still a GET

    assert made.status_code == 200, made.text
    for resp in (deleted, pruned):
        assert resp.status_code == 400, resp.text
        assert "send it with POST" in resp.json()["error"]["message"]
    assert listed.status_code == 200, listed.text
    assert [chain["name"] for chain in listed.json()["chains"]] == ["c"]
