"""Liveness (``/health``) and readiness (``/health/ready``): a serving gateway is ready; an
ingress whose actors process is down (NATS, two ``llmgw serve`` processes) still answers
``/health`` but says the actors are unreachable, is not ready, and every 503 it sends
carries ``Retry-After``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx
import pytest
import yaml

from tests.e2e.conftest import CHAT, WAIT, assert_openai_error, chat, config, model
from tests.fixtures.gateway import GatewayFactory, GatewayProcess

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.e2e

ADMIN = "adm-ready-test"


async def _spawn(started: list[GatewayProcess], *args: str) -> GatewayProcess:
    proc = GatewayProcess(["serve", *args])
    started.append(proc)
    return await asyncio.to_thread(proc.start)


async def test_serving_gateway_is_alive_and_ready(gateway_factory: GatewayFactory) -> None:
    gw = await gateway_factory(config(model("m", {"kind": "echo"})))
    live, ready = await gw.http().get("/health"), await gw.http().get("/health/ready")

    assert live.status_code == 200 and live.json()["status"] == "ok"
    assert live.json()["mode"] == "normal"
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}


@pytest.mark.nats
async def test_ingress_with_its_actors_down_is_alive_not_ready_and_every_503_says_retry_after(
    nats_url: str,
    tmp_path: Path,
    processes: list[GatewayProcess],
) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            config(
                model("m", {"kind": "echo"}),
                admin_key=ADMIN,
                database={"path": str(tmp_path / "gw.sqlite3")},
            )
        )
    )
    common = ["--config", str(cfg), "--bus", nats_url]
    actors = await _spawn(processes, *common, "--role", "actors")
    ingress = await _spawn(processes, *common, "--role", "ingress", "--port", "0")
    admin = {"authorization": f"Bearer {ADMIN}"}
    async with httpx.AsyncClient(base_url=ingress.url, timeout=WAIT) as client:
        ready_before = await client.get("/health/ready")
        live_before = await client.get("/health")
        assert actors.proc is not None
        actors.proc.kill()
        await asyncio.to_thread(actors.proc.wait)
        live = await client.get("/health")
        ready = await client.get("/health/ready")
        refused = {
            "chat": await client.post(CHAT, json=chat("m")),
            "routing": await client.get("/routing"),
            "deep": await client.get("/health/deep"),
            "admin": await client.post("/admin/config/show", json={}, headers=admin),
        }

    assert ready_before.status_code == 200 and ready_before.json() == {"status": "ready"}
    assert live_before.status_code == 200 and live_before.json()["status"] == "ok"
    assert live.status_code == 200 and live.json()["status"] == "actors_unreachable"
    assert ready.status_code == 503 and ready.json()["status"] == "unready"
    assert int(ready.headers["retry-after"]) >= 1
    for name, resp in refused.items():
        assert_openai_error(resp, 503)
        assert int(resp.headers["retry-after"]) >= 1, name
