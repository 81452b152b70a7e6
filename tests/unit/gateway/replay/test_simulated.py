"""The simulated upstream: capacity queueing, rate limits answered like a provider, outages;
on a virtual loop, so every time here is exact."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.adapters.base import UpstreamTarget
from gateway.replay.providers import ProvidersFile
from gateway.replay.simulated import SimulatedAdapter
from gateway.replay.vloop import run_virtual
from schemas import UpstreamError

TARGET = UpstreamTarget(
    endpoint="m:p", kind="openai_compat", base_url="http://p/v1", upstream_model="x",
    api_key=None, timeout=600, connect_timeout=10,
)  # fmt: skip
BODY = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}], "max_tokens": 11}


def _sim(**provider: Any) -> SimulatedAdapter:
    # A steady TTFT of 1 s and 10 tokens a second: an answer of 11 tokens takes 2 s.
    spec = {"endpoint": "m:p", "ttft": {"median": 1.0, "p90": 1.0}, "output_tps": 10, **provider}
    loop = asyncio.get_running_loop()
    providers = ProvidersFile.model_validate({"providers": [spec]})
    return SimulatedAdapter(providers, 1, loop.time, loop.time())


def test_past_its_capacity_a_route_queues_requests_in_arrival_order() -> None:
    async def scenario() -> list[float]:
        sim, loop = _sim(capacity=1), asyncio.get_running_loop()
        start = loop.time()

        async def one() -> float:
            await sim.complete(TARGET, BODY)
            return loop.time() - start

        return list(await asyncio.gather(one(), one(), one()))

    assert run_virtual(scenario()) == [2.0, 4.0, 6.0]


def test_a_cancelled_queued_request_gives_its_turn_to_the_next() -> None:
    async def scenario() -> float:
        sim, loop = _sim(capacity=1), asyncio.get_running_loop()
        start = loop.time()
        first = asyncio.create_task(sim.complete(TARGET, BODY))
        second = asyncio.create_task(sim.complete(TARGET, BODY))
        await asyncio.sleep(0.5)
        second.cancel()
        await sim.complete(TARGET, BODY)  # third: waits for the first only
        await first
        assert second.cancelled()
        return loop.time() - start

    assert run_virtual(scenario()) == 4.0


def test_beyond_its_rate_limit_a_route_answers_429_with_retry_after() -> None:
    async def burst() -> UpstreamError:
        sim = _sim(rate_limit={"requests": 2, "per_seconds": 1.0})
        served = [asyncio.create_task(sim.complete(TARGET, BODY)) for _ in range(2)]
        await asyncio.sleep(0)  # both admitted: the window is full
        with pytest.raises(UpstreamError) as refused:
            await sim.complete(TARGET, BODY)
        await asyncio.gather(*served)
        await sim.complete(TARGET, BODY)  # 2 s later the window has room again
        return refused.value

    err = run_virtual(burst())
    assert (err.status, err.kind, err.retry_after) == (429, "http_429", 1.0)


def test_in_an_outage_window_a_route_refuses_connections() -> None:
    async def scenario() -> UpstreamError:
        sim = _sim(outages=[{"start": 0, "end": 10, "kind": "connect"}])
        with pytest.raises(UpstreamError) as refused:
            await sim.complete(TARGET, BODY)
        await asyncio.sleep(10)
        await sim.complete(TARGET, BODY)  # the window is over
        return refused.value

    assert run_virtual(scenario()).kind == "connect"
