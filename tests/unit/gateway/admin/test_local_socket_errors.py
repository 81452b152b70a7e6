"""The local admin socket answers an error with the headers the HTTP admin API gives it: a 503
(no actors answer, the bus connection lost) says when to come back (``Retry-After``), a
refusal that waiting does not change (a 404) says nothing of the kind; a failure of its own
is a 500 whose ``x-request-id`` the log line naming it carries. Served on the real Unix socket
beside a database, over the in-process ``bus`` fixture (cut as a NATS connection is)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import httpx

from gateway.admin import http as admin_http
from gateway.admin import local_socket
from gateway.admin.local_socket import LocalAdmin
from gateway.http.errors import DEFAULT_RETRY_AFTER_S
from gateway.process.engines import serve_local
from tests.unit.actors.cluster_support import Link

if TYPE_CHECKING:
    from pathlib import Path

    import pytest

    from bus import Bus, InProcessBus


async def _post(to: Bus, tmp_path: Path, path: str) -> httpx.Response:
    local = LocalAdmin.open(to, str(tmp_path / "gw.sqlite3"), None, serve_local)
    assert local is not None
    try:
        transport = httpx.AsyncHTTPTransport(uds=str(local.path))
        async with httpx.AsyncClient(base_url="http://llmgw", transport=transport) as client:
            return await client.post(path, json={})
    finally:
        await local.aclose()


async def test_no_actors_answering_is_a_503_with_retry_after(
    bus: InProcessBus, tmp_path: Path
) -> None:
    resp = await _post(bus, tmp_path, "/admin/config/show")

    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "no_responders"
    assert resp.headers["retry-after"] == str(DEFAULT_RETRY_AFTER_S)


async def test_a_lost_bus_connection_is_a_503_with_retry_after(
    bus: InProcessBus, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admin_http, "RECONNECT_GRACE_S", 0.1)
    link = Link(bus)
    link.drop()

    resp = await _post(link, tmp_path, "/admin/config/show")

    assert resp.status_code == 503, resp.text
    assert "message bus (NATS)" in resp.json()["error"]["message"]
    assert resp.headers["retry-after"] == str(DEFAULT_RETRY_AFTER_S)


async def test_an_unknown_path_is_a_404_without_retry_after(
    bus: InProcessBus, tmp_path: Path
) -> None:
    resp = await _post(bus, tmp_path, "/nowhere")

    assert resp.status_code == 404, resp.text
    assert "retry-after" not in resp.headers


async def test_a_failure_of_its_own_is_a_500_whose_request_id_the_log_line_names(
    bus: InProcessBus,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(local_socket, "admin_request", broken)

    with caplog.at_level(logging.ERROR, logger=local_socket.__name__):
        resp = await _post(bus, tmp_path, "/admin/config/show")

    assert resp.status_code == 500, resp.text
    assert resp.json()["error"]["code"] == "internal"
    rid = resp.headers["x-request-id"]
    [record] = [r for r in caplog.records if r.name == local_socket.__name__]
    assert record.exc_info is not None
    assert record.getMessage() == f"unhandled error serving POST /admin/config/show ({rid})"
