"""Scaled out on NATS: one ``--role actors`` process and two ``--role ingress`` processes.

A circuit opened by traffic through one ingress refuses traffic through the other: the breaker
lives in the single actors process, not in either ingress.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx
import pytest
import yaml

from bus import open_bus
from schemas import subjects
from tests.e2e.conftest import (
    CHAT,
    WAIT,
    Watch,
    assert_openai_error,
    chat,
    config,
    eid,
    model,
    route,
)
from tests.fixtures.gateway import GatewayProcess
from tests.fixtures.upstream import FakeUpstream, Reply

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = [pytest.mark.e2e, pytest.mark.nats]


async def _spawn(started: list[GatewayProcess], *args: str) -> GatewayProcess:
    proc = GatewayProcess(["serve", *args])
    started.append(proc)
    return await asyncio.to_thread(proc.start)


async def test_circuit_opened_through_one_ingress_refuses_traffic_through_the_other(
    nats_url: str,
    tmp_path: Path,
    fake_upstream: FakeUpstream,
    processes: list[GatewayProcess],
) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        yaml.safe_dump(
            config(
                model("m", route(fake_upstream)),
                circuit={"failure_threshold": 2, "cooldown_seconds": 30},
            )
        )
    )
    common = ["--config", str(cfg), "--bus", nats_url]
    actors = await _spawn(processes, *common, "--role", "actors")
    one, two = await asyncio.gather(
        _spawn(processes, *common, "--role", "ingress", "--port", "0"),
        _spawn(processes, *common, "--role", "ingress", "--port", "0"),
    )
    fake_upstream.set_default(Reply(500))
    watcher = await open_bus(nats_url, name="test-watcher")
    try:
        async with (
            watcher.subscribe(subjects.event("circuit")) as events,
            httpx.AsyncClient(base_url=one.url, timeout=WAIT) as via_one,
            httpx.AsyncClient(base_url=two.url, timeout=WAIT) as via_two,
        ):
            assert (await via_two.post(CHAT, json=chat("m"))).status_code == 502
            assert (await via_one.post(CHAT, json=chat("m"))).status_code == 502
            opened = await Watch(events).circuit("open")

            refused = await via_two.post(CHAT, json=chat("m"))
            refused_too = await via_one.post(CHAT, json=chat("m"))
            deep = (await via_two.get("/health/deep")).json()["endpoints"]
    finally:
        await watcher.aclose()

    assert actors.ready_line == f"llmgw actors running on {nats_url}"
    assert (opened.endpoint, opened.new) == (eid("m", fake_upstream), "open")
    for resp in (refused, refused_too):
        assert_openai_error(resp, 503, "all_circuits_open")
        assert int(resp.headers["retry-after"]) in (29, 30)
    assert deep[eid("m", fake_upstream)]["circuit_state"] == "open"
    assert len(fake_upstream.requests) == 2
