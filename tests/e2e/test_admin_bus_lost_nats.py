"""Admin commands while the gateway has lost its NATS connection: the HTTP admin API and the
local admin socket refuse at once (503 with ``Retry-After``, saying the bus is lost) instead
of sending the command into nats-py's reconnect buffer and waiting out the 30 s admin
timeout; once NATS is back, the same commands answer again. A command already waiting for
its reply when the connection is lost ends within the reconnect grace too, with a 503 that
says its outcome is unknown (its owner may have applied it), not at its timeout."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import anyio
import httpx
import pytest

from bus import NatsBus
from gateway.admin.local_socket import socket_path
from schemas import subjects
from tests.e2e.conftest import WAIT, config, model
from tests.fixtures.gateway import start_gateway
from tests.fixtures.nats import start_nats_server, until_connected

if TYPE_CHECKING:
    from pathlib import Path


pytestmark = [pytest.mark.e2e, pytest.mark.nats]

ADMIN = "adm-bus-lost-key"
AUTH = {"authorization": f"Bearer {ADMIN}"}
REFUSED_WITHIN_S = 10.0  # the admin timeout is 30 s; a refusal comes within the 2 s grace
ABANDONED_WITHIN_S = 20.0  # the same for a command in flight; within the test's 60 s, so
# one that waits out its 30 s timeout fails here instead of passing slowly


async def test_admin_commands_refuse_with_503_while_the_bus_is_lost(tmp_path: Path) -> None:
    cfg = config(model("m", {"kind": "echo"}), admin_key=ADMIN)
    with start_nats_server(tmp_path / "nats") as url:
        port = int(url.rsplit(":", 1)[1])
        gw = await start_gateway(cfg, url, data_dir=tmp_path)
    stopped = False
    try:
        assert gw.bus is not None
        await until_connected(gw.bus, False)  # the server is gone; nats-py reconnects
        sock = socket_path(tmp_path / "llmgw.sqlite3")
        local = httpx.AsyncHTTPTransport(uds=str(sock))
        async with (
            httpx.AsyncClient(base_url=gw.url, headers=AUTH, timeout=60) as http,
            httpx.AsyncClient(base_url="http://llmgw", transport=local, timeout=60) as admin,
        ):
            with anyio.fail_after(REFUSED_WITHIN_S):
                over_http = await http.get("/admin/config/show")
            with anyio.fail_after(REFUSED_WITHIN_S):
                over_socket = await admin.post("/admin/config/show", json={})

            assert over_http.status_code == 503, over_http.text
            assert over_http.headers["retry-after"] == "5"
            error = over_http.json()["error"]
            assert error["code"] == "no_responders"
            assert "lost its connection to its message bus" in error["message"], error
            assert over_socket.status_code == 503, over_socket.text
            assert "message bus (NATS)" in over_socket.json()["error"]["message"]

            with start_nats_server(tmp_path / "nats", port=port):
                await until_connected(gw.bus, True)
                back = await http.get("/admin/config/show")
                assert back.status_code == 200, back.text
                assert back.json()["models"] == ["m"]
                stopped = True
                await gw.stop()  # while NATS is up: a gateway stops cleanly
    finally:
        if not stopped:
            await gw.stop()


async def test_an_admin_command_waiting_when_the_bus_is_lost_ends_with_503_outcome_unknown(
    tmp_path: Path,
) -> None:
    cfg = config(model("m", {"kind": "echo"}), admin_key=ADMIN)
    local = httpx.AsyncHTTPTransport(uds=str(socket_path(tmp_path / "llmgw.sqlite3")))
    async with (
        httpx.AsyncClient(headers=AUTH, timeout=60) as http,
        httpx.AsyncClient(base_url="http://llmgw", transport=local, timeout=60) as admin,
    ):
        with start_nats_server(tmp_path / "nats") as url:
            port = int(url.rsplit(":", 1)[1])
            gw = await start_gateway(cfg, url, data_dir=tmp_path)
            # The area's owner is slow: it has taken both commands and not answered when the
            # connection drops (an answer it sent then would be lost with the connection).
            owner = await NatsBus.connect(url)
            async with owner.subscribe(subjects.admin_area("slow")) as commands:
                sent = [
                    asyncio.create_task(http.post(f"{gw.url}/admin/slow/apply", json={})),
                    asyncio.create_task(admin.post("/admin/slow/apply", json={})),
                ]
                taken = []
                with anyio.fail_after(WAIT):
                    async for env in commands:
                        taken.append(env.subject)
                        if len(taken) == 2:
                            break
            await owner.aclose()
        stopped = False
        try:
            assert gw.bus is not None and len(taken) == 2
            with anyio.fail_after(ABANDONED_WITHIN_S):
                over_http, over_socket = await asyncio.gather(*sent)

            assert over_http.status_code == 503, over_http.text
            assert over_http.headers["retry-after"] == "5"
            error = over_http.json()["error"]
            assert error["code"] == "bus_timeout"
            assert "outcome is unknown" in error["message"], error
            assert "check before sending it again" in error["message"], error
            assert over_socket.status_code == 503, over_socket.text
            assert "outcome is unknown" in over_socket.json()["error"]["message"]

            with start_nats_server(tmp_path / "nats", port=port):
                await until_connected(gw.bus, True)
                stopped = True
                await gw.stop()  # while NATS is up: a gateway stops cleanly
        finally:
            for task in sent:
                task.cancel()
            if not stopped:
                await gw.stop()
