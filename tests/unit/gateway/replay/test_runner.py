"""The replay runner: the real gateway on a virtual clock, repeatable byte for byte."""

from __future__ import annotations

import asyncio

import pytest

from gateway.replay.compare import compare
from gateway.replay.providers import ProvidersFile
from gateway.replay.report import to_json
from gateway.replay.runner import replay_config
from gateway.replay.synth import SynthSpec, synthesize
from gateway.replay.trace import TraceRequest
from gateway.replay.vloop import run_virtual
from schemas.config import GatewayConfig
from tests.unit.gateway.replay import providers, two_routes

HOUR = 3600.0


def test_replay_of_an_hour_long_trace_runs_the_hour_on_virtual_time_and_answers_every_request() -> (
    None
):
    trace = [
        TraceRequest(id=f"r{i}", t=i * HOUR / 120, model="m", stream=i % 3 != 0) for i in range(120)
    ]
    run = run_virtual(replay_config("fixed", two_routes(), trace, providers(), seed=1))
    assert len(run.outcomes) == 120
    assert all(o.served for o in run.outcomes)
    # The last request arrives 59.5 virtual minutes in and is answered after it.
    assert trace[-1].t < run.duration < HOUR + 60
    assert {o.endpoint for o in run.outcomes} == {"m:cheap", "m:fast"}
    assert all(len(run.observations[o.request_id]) == 1 for o in run.outcomes)


def test_replays_with_the_same_seed_give_byte_identical_json_reports() -> None:
    trace = synthesize(SynthSpec(model="m", rate=2.0, duration_seconds=120, callers=5), seed=3)
    configs = [("fixed", two_routes()), ("fixed-affinity", two_routes(affinity={"enabled": True}))]
    sim = providers(capacity=2, rate_limit={"requests": 60}, errors={"http_500": 0.02})
    first, _ = compare(configs, trace, sim, seed=11)
    again, _ = compare(configs, trace, sim, seed=11)
    assert to_json(first) == to_json(again)
    other, _ = compare(configs, trace, sim, seed=12)
    assert to_json(other) != to_json(first)  # the seed reaches the draws


def test_replay_refuses_to_run_on_an_ordinary_event_loop() -> None:
    run = replay_config("fixed", two_routes(), [], providers(), seed=1)
    with pytest.raises(RuntimeError, match="VirtualTimeLoop"):
        asyncio.run(run)


def test_replay_of_routewise_is_repeatable_too() -> None:
    trace = synthesize(SynthSpec(model="m", rate=3.0, duration_seconds=120, callers=5), seed=4)
    base = two_routes()
    routewise = base.model_copy(
        update={
            "models": tuple(
                m.model_copy(update={"router": "routewise", "router_params": {"budget_alpha": 1}})
                for m in base.models
            )
        }
    )
    sim = providers(capacity=3)
    first, _ = compare([("routewise", routewise)], trace, sim, seed=2)
    again, _ = compare([("routewise", routewise)], trace, sim, seed=2)
    assert to_json(first) == to_json(again)
    assert first["configs"]["routewise"]["served"] == len(trace)


def test_auto_requests_are_steered_by_the_real_resolver_to_the_chain_models() -> None:
    config = GatewayConfig.model_validate(
        {
            "models": [
                {"id": name, "route": [{"kind": "openai_compat", "base_url": f"http://{name}/v1"}]}
                for name in ("small", "big")
            ],
            "chains": [{"name": "default", "models": ["small", "big"]}],
        }
    )
    sim = ProvidersFile.model_validate(
        {
            "providers": [
                {"base_url": "http://small/v1", "ttft": {"median": 0.2, "p90": 0.4}},
                {"base_url": "http://big/v1", "ttft": {"median": 0.1, "p90": 0.2}},
            ]
        }
    )
    trace = [TraceRequest(id=f"r{i}", t=float(i), model="auto") for i in range(20)]
    run = run_virtual(replay_config("auto", config, trace, sim, seed=1))
    assert all(o.served for o in run.outcomes)
    # The chain's first model serves an unlabelled caller while it is healthy.
    assert {o.endpoint for o in run.outcomes} == {"small:small"}
