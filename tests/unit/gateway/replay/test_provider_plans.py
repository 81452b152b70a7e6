"""A provider's quota plan, concurrency plan and refused keys, met by the real routing: the
gateway mutes the credential the provider refuses or whose quota is spent and serves on
with the other, the request that met the refusal included (retried at once on the route's
next key)."""

from __future__ import annotations

from collections import Counter

import pytest

from gateway.replay.oracle import oracle_for
from gateway.replay.providers import ProvidersFile
from gateway.replay.runner import replay_config
from gateway.replay.trace import TraceRequest
from gateway.replay.vloop import run_virtual
from schemas import QUOTA_EXHAUSTED
from schemas.config import GatewayConfig
from tests.unit.gateway.replay import providers, two_routes

STEADY = {"median": 0.2, "p90": 0.2}


def _one_route_two_keys(*more: str) -> GatewayConfig:
    keys = ["sk-a", "sk-b", *more]
    route = {"kind": "openai_compat", "base_url": "http://p/v1", "api_keys": keys}
    return GatewayConfig.model_validate({"models": [{"id": "m", "route": [route]}]})


def _trace(n: int) -> list[TraceRequest]:
    return [TraceRequest(id=f"r{i}", t=float(i), model="m", output_tokens=10) for i in range(n)]


def _provider(**plan: object) -> ProvidersFile:
    return ProvidersFile.model_validate(
        {"providers": [{"endpoint": "m:p", "ttft": STEADY, **plan}]}
    )


def test_a_spent_quota_mutes_its_key_and_the_other_key_serves_on() -> None:
    run = run_virtual(
        replay_config(
            "quota", _one_route_two_keys(), _trace(30), _provider(quota={"requests": 20}), seed=1
        )
    )
    kinds = Counter(ob.error_kind for obs in run.observations.values() for ob in obs)
    assert kinds[QUOTA_EXHAUSTED] == 1  # met once: then the key is muted
    assert kinds[""] == 30 == sum(o.served for o in run.outcomes)  # that one on the other key
    assert ("key", "m:p", "muted") in {(t.kind, t.endpoint, t.state) for t in run.transitions}


def test_a_refused_key_is_muted_and_the_route_serves_with_the_other() -> None:
    run = run_virtual(
        replay_config(
            "refused", _one_route_two_keys(), _trace(30), _provider(refused_keys=["sk-a"]), seed=1
        )
    )
    statuses = Counter(ob.status for obs in run.observations.values() for ob in obs)
    assert statuses[403] == 1  # met once: then the key is muted
    assert sum(o.served for o in run.outcomes) == 30  # that one on the other key
    assert ("key", "m:p", "muted") in {(t.kind, t.endpoint, t.state) for t in run.transitions}


def test_a_pool_with_a_refused_key_and_one_whose_quota_runs_out_serves_every_request() -> None:
    # sk-a is refused from the start; sk-b spends its 20 requests a day; sk-c serves on.
    config = _one_route_two_keys("sk-c")
    plan = _provider(refused_keys=["sk-a"], quota={"requests": 20})
    run = run_virtual(replay_config("pool", config, _trace(40), plan, seed=1))
    assert all(o.served for o in run.outcomes)
    failed = Counter(
        (ob.status, ob.error_kind) for obs in run.observations.values() for ob in obs if ob.status
    )
    assert failed[(403, "http_403")] == 1 and failed[(429, QUOTA_EXHAUSTED)] == 1
    # Neither key comes back: the refused key's probe (due after 30 s) is refused too.
    keys = [(t.at, t.state) for t in run.transitions if t.kind == "key"]
    assert keys == [(0.0, "muted"), (20.0, "muted"), (30.0, "muted")]


def test_past_a_concurrency_plan_the_route_answers_429_and_the_gateway_fails_over() -> None:
    config = GatewayConfig.model_validate(
        {
            "routing": {"affinity": {"enabled": False}},
            "models": [
                {
                    "id": "m",
                    "route": [
                        {"kind": "openai_compat", "base_url": "http://plan/v1"},
                        {
                            "kind": "openai_compat",
                            "base_url": "http://spare/v1",
                            "fallback_only": True,
                        },
                    ],
                }
            ],
        }
    )
    providers = ProvidersFile.model_validate(
        {
            "providers": [
                {
                    "endpoint": "m:plan",
                    "ttft": STEADY,
                    "output_tps": 10,
                    "concurrency": {"limit": 2},
                },
                {"endpoint": "m:spare", "ttft": STEADY, "output_tps": 10},
            ]
        }
    )
    # Ten requests a second, each 5 s long: far more than 2 in flight.
    trace = [TraceRequest(id=f"r{i}", t=i / 10, model="m", output_tokens=50) for i in range(60)]
    run = run_virtual(replay_config("plan", config, trace, providers, seed=1))
    assert all(o.served for o in run.outcomes)
    plan_429s = [
        ob
        for obs in run.observations.values()
        for ob in obs
        if ob.endpoint == "m:plan" and ob.status == 429
    ]
    assert plan_429s
    assert Counter(o.endpoint for o in run.outcomes)["m:spare"] > 30


def test_the_oracle_fills_a_route_no_further_than_its_plans_and_usable_keys_allow() -> None:
    trace = _trace(40)  # one a second: 40 s
    cheap = (100 * 1.0 + 10 * 2.0) / 1e6  # USD of one request on each route of two_routes()
    dear = (100 * 4.0 + 10 * 8.0) / 1e6

    def fill_cost(**cheap_plan: object) -> float:
        cost = oracle_for(two_routes(), providers(**cheap_plan), trace).cost_usd
        assert cost is not None
        return cost

    assert fill_cost() == pytest.approx(40 * cheap)
    assert fill_cost(quota={"requests": 10}) == pytest.approx(10 * cheap + 30 * dear)
    # One in flight, each held 0.4 s + 9 tokens at 50 a second (about 0.6 s): about 66 in
    # 40 s, more than the trace; an hour-long hold would be under one.
    assert fill_cost(concurrency={"limit": 1}) == pytest.approx(40 * cheap)
    assert fill_cost(concurrency={"limit": 1}, output_tps=0.01) < 1 * cheap + 40 * dear
    assert fill_cost(concurrency={"limit": 1}, output_tps=0.01) > 0.5 * cheap + 39 * dear


def test_the_oracle_leaves_out_a_route_whose_only_key_the_provider_refuses() -> None:
    config = _one_route_two_keys()
    assert oracle_for(config, _provider(refused_keys=["sk-a"]), _trace(10)).ttft_mean is not None
    refused_both = _provider(refused_keys=["sk-a", "sk-b"])
    assert oracle_for(config, refused_both, _trace(10)).ttft_mean is None
