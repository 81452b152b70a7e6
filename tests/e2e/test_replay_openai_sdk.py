"""The replay against the live gateway: the real server (Hypercorn, wall clock) with fake
upstreams on loopback, driven with the openai SDK; then its request log, replayed against
simulated providers that behave like those upstreams.

- A request log written by a real gateway replays, and a deterministic config's decisions
  (the route that served each request, the attempts it took) are the live run's.
- One small scenario (a route down, one attempt per request, so the client sees the
  failures the circuit lets through) gives the same served share within 2 points and the
  same mean TTFT within 15 % live and simulated.

Both run on the in-process bus only: the comparison is of the routing, not of the bus.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai
import pytest

from gateway.cli.logs_offline import read_rows
from gateway.replay.providers import ProvidersFile
from gateway.replay.runner import replay_config
from gateway.replay.trace import read_trace
from gateway.replay.vloop import run_virtual
from tests.e2e.conftest import HI, config, model, route
from tests.fixtures.upstream import Reply, Stream

if TYPE_CHECKING:
    from gateway.replay.outcome import RunResult
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = pytest.mark.e2e

_KEEPS_OPEN = {"failure_threshold": 3, "cooldown_seconds": 300}  # longer than each test


@pytest.fixture
def bus_url() -> str:
    return "inproc://"


async def send(gw: RunningGateway, n: int, api_key: str = "sk-test") -> int:
    """``n`` streamed chat requests one after another (presenting ``api_key``); how many
    were answered whole."""
    client = gw.openai(api_key=api_key)
    served = 0
    for _ in range(n):
        try:
            stream = await client.chat.completions.create(model="m", messages=HI, stream=True)
            async for _chunk in stream:
                pass
        except openai.APIStatusError:
            continue
        served += 1
    return served


async def _logged_trace(gw: RunningGateway, tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    """Stop ``gw`` (its request log flushes) and write its rows as ``llmgw logs --json`` does."""
    await gw.stop()
    rows = read_rows(Path(gw.config.database.path), {"kind": "request"})
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
    return path, rows


async def _replay(gw: RunningGateway, trace: Path, providers: dict[str, Any]) -> RunResult:
    """The logged trace replayed on its own virtual loop (in a thread: this one's is running)."""
    sim = ProvidersFile.model_validate(providers)
    requests = read_trace(trace)
    return await asyncio.to_thread(
        lambda: run_virtual(replay_config("live", gw.config, requests, sim, seed=1))
    )


async def test_a_live_request_log_replays_with_the_same_route_and_attempts_per_request(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, tmp_path: Path
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    a.default = Reply(503)  # the primary is down: three failures open its circuit
    gw = await gateway_factory(
        config(
            model("m", route(a), route(b, fallback_only=True)),
            circuit=_KEEPS_OPEN,
            routing={"affinity": {"enabled": False}},
        )
    )
    assert await send(gw, 8) == 8
    trace, rows = await _logged_trace(gw, tmp_path)
    run = await _replay(
        gw,
        trace,
        {
            "providers": [
                {
                    "base_url": a.openai_base_url,
                    "ttft": {"median": 0.01, "p90": 0.01},
                    "outages": [{"start": 0, "end": 1e6, "kind": "http_503"}],
                },
                {"base_url": b.openai_base_url, "ttft": {"median": 0.01, "p90": 0.01}},
            ]
        },
    )
    live = [(r["request_id"], r["endpoint"], r["attempt"]) for r in rows]
    replayed = [(o.id, o.endpoint, len(run.observations[o.request_id])) for o in run.outcomes]
    assert replayed == live
    assert [attempts for _, _, attempts in live] == [2, 2, 2, 1, 1, 1, 1, 1]


async def test_a_small_scenario_serves_the_same_share_at_the_same_ttft_live_and_simulated(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, tmp_path: Path
) -> None:
    ttft = 0.4
    a = await fake_upstreams("a", default=Stream(first_token_delay=ttft))
    b = await fake_upstreams("b", default=Reply(503))
    gw = await gateway_factory(
        config(
            model("m", route(a), route(b)),
            circuit=_KEEPS_OPEN,
            routing={"affinity": {"enabled": False}, "failover": {"max_attempts": 1}},
        )
    )
    n = 16
    served_live = await send(gw, n) / n
    trace, rows = await _logged_trace(gw, tmp_path)
    ttft_live = [r["ttft_ms"] / 1000 for r in rows if r["status"] == 200]
    run = await _replay(
        gw,
        trace,
        {
            "providers": [
                {"base_url": a.openai_base_url, "ttft": {"median": ttft, "p90": ttft}},
                {
                    "base_url": b.openai_base_url,
                    "ttft": {"median": 0.01, "p90": 0.01},
                    "outages": [{"start": 0, "end": 1e6, "kind": "http_503"}],
                },
            ]
        },
    )
    served_sim = sum(o.served for o in run.outcomes) / len(run.outcomes)
    ttft_sim = [o.ttft for o in run.outcomes if o.ttft is not None]
    assert len(run.outcomes) == n
    assert served_live < 1.0  # the down route's first failures reached clients
    assert abs(served_sim - served_live) <= 0.02
    mean_live, mean_sim = sum(ttft_live) / len(ttft_live), sum(ttft_sim) / len(ttft_sim)
    assert abs(mean_sim - mean_live) <= 0.15 * mean_live
