"""A config file with a syntax error next to an upstream key: no path that reports the error
quotes the key (reload answers over HTTP and the bus, the admin CLI, the ``AdminExecuted``
audit event, log lines, ``llmgw serve``, ``llmgw keys``, ``llmgw logs``)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import yaml

from gateway.adapters.sse import SSEParser
from schemas import AdminCommand, AdminExecuted, ErrorReply, subjects
from tests.e2e.conftest import WAIT, config, gateway_bus, model, watch
from tests.fixtures.gateway import REPO, GatewayFactory, GatewayProcess

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

pytestmark = pytest.mark.e2e

ADMIN = "adm-secrets-test"
AUTH = {"authorization": f"Bearer {ADMIN}"}
SECRET = "sk-live-9f8e7d6c5b4a39281706"
PROCESS_WAIT = 30.0
# An unterminated quote: PyYAML's own message would show this line with the key in it.
BROKEN = f"""\
admin_key: {ADMIN}
models:
  - id: m
    route:
      - kind: openai_compat
        base_url: http://127.0.0.1:9/v1
        api_key: "{SECRET}
"""
WHERE = "line 8, column 1: not valid YAML"


def _good(tmp_path: Path) -> dict[str, Any]:
    return config(
        model("m", {"kind": "echo"}),
        admin_key=ADMIN,
        database={"path": str(tmp_path / "gw.sqlite3")},
    )


def _llmgw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=PROCESS_WAIT,
        check=False,
    )


class _Frames(list[dict[str, Any]]):
    """Frames received so far; ``until(n)`` awaits the n-th."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = asyncio.Event()

    async def until(self, n: int) -> None:
        async with asyncio.timeout(WAIT):
            while len(self) < n:
                self.changed.clear()
                await self.changed.wait()


@asynccontextmanager
async def _admin_events(client: httpx.AsyncClient) -> AsyncIterator[_Frames]:
    """Collect ``/events?kind=admin`` frames (as JSON) while the block runs."""
    frames = _Frames()
    async with client.stream("GET", "/events", params={"kind": "admin"}, headers=AUTH) as resp:
        chunks = resp.aiter_bytes()
        assert b"subscribed" in await anext(chunks)
        parser = SSEParser()

        async def read() -> None:
            async for chunk in chunks:
                frames.extend(json.loads(data) for _, data in parser.feed(chunk))
                frames.changed.set()

        reader = asyncio.create_task(read())
        try:
            yield frames
        finally:
            reader.cancel()


async def test_broken_config_reports_never_quote_the_key_from_http_cli_events_and_logs(
    bus_url: str,
    tmp_path: Path,
    processes: list[GatewayProcess],
) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(yaml.safe_dump(_good(tmp_path)))
    gw = GatewayProcess(["serve", "--config", str(cfg), "--bus", bus_url, "--port", "0"])
    processes.append(gw)
    await asyncio.to_thread(gw.start)
    cfg.write_text(BROKEN)
    async with (
        httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as client,
        _admin_events(client) as events,
    ):
        over_http = await client.post("/admin/config/reload", json={}, headers=AUTH)
        cli_url = await asyncio.to_thread(
            _llmgw, "admin", "reload", "--url", gw.url, "--admin-key", ADMIN
        )
        clis = [cli_url]
        if bus_url.startswith("nats://"):
            clis.append(await asyncio.to_thread(_llmgw, "admin", "reload", "--bus", bus_url))
        await events.until(len(clis) + 1)
    serve_log = await asyncio.to_thread(gw.stop)
    serve_broken = await asyncio.to_thread(_llmgw, "serve", "--config", str(cfg), "--port", "0")
    keys = await asyncio.to_thread(_llmgw, "keys", "list", "--config", str(cfg))
    logs = await asyncio.to_thread(_llmgw, "logs", "--config", str(cfg))

    assert over_http.status_code == 400
    assert WHERE in over_http.json()["error"]["message"] and SECRET not in over_http.text
    for cli in clis:
        assert cli.returncode == 1 and WHERE in cli.stderr, cli.stderr
        assert SECRET not in cli.stdout + cli.stderr
    assert [(e["type"], e["area"], e["verb"], e["ok"]) for e in events] == [
        ("AdminExecuted", "config", "reload", False)
    ] * (len(clis) + 1)
    assert all(WHERE in e["message"] and SECRET not in e["message"] for e in events), events
    assert "config reload by" in serve_log and WHERE in serve_log  # the refusal is logged
    assert SECRET not in serve_log
    for refused in (serve_broken, keys, logs):
        assert refused.returncode == 2, refused.stderr
        assert WHERE in refused.stderr and SECRET not in refused.stdout + refused.stderr
        assert "Traceback" not in refused.stderr


async def test_reload_over_the_bus_of_a_broken_file_keeps_the_key_out_of_reply_event_and_logs(
    gateway_factory: GatewayFactory,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "gw.yaml"
    gw = await gateway_factory(_good(tmp_path), config_path=path)
    path.write_text(BROKEN)
    caplog.set_level(logging.DEBUG)
    async with watch(gw, subjects.event("admin")) as audit:
        reply = await gateway_bus(gw).request(
            subjects.admin("config", "reload"),
            AdminCommand(by="test"),
            reply_type=ErrorReply,
            timeout=WAIT,
        )
        event = await audit.next(AdminExecuted)

    assert isinstance(reply, ErrorReply) and WHERE in reply.message, reply
    assert (event.verb, event.ok) == ("reload", False) and WHERE in event.message
    assert SECRET not in reply.message + event.message
    assert any(WHERE in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if SECRET in r.getMessage()]
