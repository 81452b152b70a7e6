"""The scenario library (docs/scenarios/) replayed on short traces: every report is complete
and consistent. Which config wins is not asserted here (that is issue #24's)."""

from __future__ import annotations

import math

import pytest

from gateway.cli.replay import SCENARIOS, scenario_dir
from gateway.process.config import load_config
from gateway.replay.compare import compare
from gateway.replay.providers import load_providers
from gateway.replay.synth import load_synth, synthesize
from schemas.pricing import PER_MILLION

NAMES = (
    "ratelimited",
    "tokenlimited",
    "outputlimited",
    "saturating",
    "outage",
    "drift",
    "flaky",
    "paper",
)
# Each trace is as short as reaches what makes its scenario: the outage (from 30 s), the flaky
# route's bad spell (from 10 s), paper's opening burst absorbed (before 15 s the routes cannot
# take every request, and the oracle has no fastest fill); rate limits and capacity bite within
# the first seconds (token limits only past their 10 s buckets: ``tokenlimited`` and
# ``outputlimited`` are checked for consistency here, under load in test_under_load). The
# drift (from 120 s) is out of reach, as it always was here. Every simulated request costs
# the whole gateway's work, seven times (one per config).
SHORT = {"outage": 40.0, "flaky": 12.0, "paper": 15.0, "tokenlimited": 4.0, "outputlimited": 4.0}
DEFAULT_SECONDS = 8.0
BASELINES = {"greedy-cost": "greedy_cost", "greedy-latency": "greedy_latency"}
_TOLERANCE = 0.02  # sampling noise of the measured means against the oracle's expectations


def test_the_library_holds_exactly_the_documented_scenarios() -> None:
    assert sorted(p.name for p in SCENARIOS.iterdir() if p.is_dir()) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_scenario_report_is_complete_and_consistent(name: str) -> None:
    folder = scenario_dir(name)
    providers = load_providers(folder / "providers.yaml")
    spec = load_synth(folder / "synth.yaml")
    trace = synthesize(spec, seed=5, duration_seconds=SHORT.get(name, DEFAULT_SECONDS))
    configs = [(p.stem, load_config(str(p))) for p in sorted((folder / "configs").glob("*.yaml"))]
    routers = {name: config.models[0].router for name, config in configs}
    assert {name: routers[name] for name in BASELINES} == BASELINES  # from a file, like any
    assert len(configs) == 7
    report, _ = compare(configs, trace, providers, seed=5)
    oracle = report["oracle"]
    assert oracle["ttft_mean"] is not None and oracle["cost_usd"] is not None
    for (config_name, config), summary in zip(configs, report["configs"].values(), strict=True):
        assert summary["requests"] == len(trace)
        assert summary["served"] + sum(summary["errors"].values()) == len(trace), config_name
        served_by_route = sum(sum(r) for r in summary["share_by_route"]["routes"].values())
        assert served_by_route == summary["served"]
        prices = {
            eid: route.pricing
            for m in config.models
            for eid, route in zip(m.endpoint_ids(), m.route, strict=True)
        }
        billed = math.fsum(
            (prompt * price.prompt + completion * price.completion) / PER_MILLION
            for e, (prompt, completion) in summary["billed_tokens"].items()
            if (price := prices[e]) is not None
        )
        assert summary["cost_usd"] == pytest.approx(billed, rel=1e-6, abs=1e-6), config_name
        if summary["served"]:
            # Against the fastest fill of as many requests as it served (a config that fails
            # the slow half shows the fast half's TTFT).
            bound = summary["oracle"]["ttft_mean_at_served"]
            assert summary["ttft_mean"] >= bound * (1 - _TOLERANCE), config_name
        if summary["served"] == len(trace):
            own = summary["oracle"]["cost_usd"]
            assert summary["cost_usd"] >= own * (1 - _TOLERANCE), config_name
        assert summary["virtual_seconds"] >= trace[-1].t
