"""Bounded metric labels, through the real server process with telemetry on: a thousand
scanner-style paths and model names add no series to ``/metrics`` and show up in no label;
the GenAI client metrics are on ``/metrics`` and arrive over OTLP."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from tests.e2e.conftest import HI, WAIT, config, model, route
from tests.e2e.telemetry_support import GATEWAY_KEY, start_traced

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayProcess
    from tests.fixtures.otlp import OtlpReceiver
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = pytest.mark.e2e

SCANS = 1000
_AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
GENAI = ("gen_ai.client.operation.duration", "gen_ai.client.token.usage")


async def _series(http: httpx.AsyncClient) -> set[str]:
    """Every series ``/metrics`` exposes (name and labels, without the value)."""
    text = (await http.get("/metrics", headers=_AUTH)).text
    return {line.rsplit(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")}


async def _scan(http: httpx.AsyncClient, i: int) -> None:
    """What a scanner sends: odd paths, and inference with a model of its own invention."""
    match i % 4:
        case 0:
            await http.get(f"/wp-admin/scan-{i}.php")
        case 1:
            await http.post("/v1/chat/completions", json={"model": f"scan-{i}", "messages": HI})
        case 2:
            await http.post(f"/v1/messages/scan-{i}", json={"model": f"scan-{i}"})
        case _:
            await http.get(f"/v1/models/scan-{i}")


async def test_telemetry_scanner_paths_and_models_add_no_metric_series(
    processes: list[GatewayProcess],
    tmp_path: Path,
    otlp_receiver: OtlpReceiver,
    fake_upstreams: UpstreamFactory,
) -> None:
    up = await fake_upstreams("a")
    gw = await start_traced(
        processes,
        tmp_path,
        otlp_receiver,
        config(model("m", route(up)), admin_key=GATEWAY_KEY),
    )
    async with (
        openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="sk-x", max_retries=0) as client,
        httpx.AsyncClient(base_url=gw.url, timeout=WAIT) as http,
    ):
        await client.chat.completions.create(model="m", messages=HI)
        await client.chat.completions.create(model="m", messages=HI, stream=True)
        for i in range(4):  # one of each kind first: the series they may add exist now
            await _scan(http, SCANS + i)
        await _series(http)  # the first scrape adds its own (health, log) series
        before = await _series(http)

        for start in range(0, SCANS, 50):
            await asyncio.gather(*(_scan(http, i) for i in range(start, start + 50)))
        after = await _series(http)

    assert after == before
    assert not [s for s in after if "scan-" in s or "wp-admin" in s]
    genai = {s.split("{", 1)[0] for s in after if s.startswith("gen_ai_client_")}
    assert {
        "gen_ai_client_operation_duration_seconds_bucket",
        "gen_ai_client_token_usage_bucket",
        "gen_ai_client_operation_time_to_first_chunk_seconds_bucket",
    } <= genai
    names = await otlp_receiver.wait_for(
        lambda r: r.metric_names if set(GENAI) <= r.metric_names else None, WAIT
    )
    assert "gen_ai.client.operation.time_to_first_chunk" in names
