"""RouteWise decision micro-benchmark: what one ModelActor decision costs at N routes.

    python -m tests.benchmarks.bench decisions [--routes 5,20,100] [--seconds 2]

For each N it builds a RouteWise strategy over N priced routes with latency evidence, then
times, in this process on the calling core, the work the ModelActor does per request: the
primary (``select``) and the LP-ordered fallbacks of the rest (``fallback_order``, asked as
the planner asks it: after that select). Every request has a new prompt size, so the LP
cache never answers; it prints p50/p99 in microseconds, and the library's own
pair-enumerating LP at the same N for comparison.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import TYPE_CHECKING

from llm_routewise.core.lp import cost_tiebroken_objective

from actors.strategies import RouteView, StrategyDeps, build_strategy
from actors.strategies.routewise import RouteWiseStrategy
from actors.strategies.routewise.solver import budget_for, solve_hull, solve_with_library
from schemas import Observation, RouteRequest
from schemas.config import ModelConfig

if TYPE_CHECKING:
    from collections.abc import Callable


def _strategy(n: int) -> tuple[RouteWiseStrategy, list[RouteView]]:
    rng = random.Random(n)
    model = ModelConfig.model_validate(
        {
            "id": "m",
            "router": "routewise",
            "route": [
                {
                    "kind": "openai_compat",
                    "base_url": "http://127.0.0.1:9/v1",
                    "pricing": {"prompt": rng.uniform(0.05, 5), "completion": rng.uniform(0.1, 20)},
                }
                for _ in range(n)
            ],
        }
    )
    now = time.time()
    strategy = build_strategy(
        "routewise", {"budget_alpha": 0.5}, StrategyDeps(model=model, clock=lambda: now)
    )
    assert isinstance(strategy, RouteWiseStrategy)
    views = [
        RouteView(index=i, endpoint=e, weight=1.0, route=r)
        for i, (e, r) in enumerate(zip(model.endpoint_ids(), model.route, strict=True))
    ]
    for v in views:
        for _ in range(20):
            strategy.observe(
                Observation(
                    endpoint=v.endpoint,
                    model="m",
                    outcome="success",
                    ttft_ms=rng.uniform(100, 4000),
                    prompt_tokens=500,
                    completion_tokens=rng.randint(20, 400),
                    ts=now,
                )
            )
    return strategy, views


def _time(fn: Callable[[int], object], seconds: float) -> list[float]:
    samples: list[float] = []
    end = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < end:
        i += 1
        t0 = time.perf_counter()
        fn(i)
        samples.append((time.perf_counter() - t0) * 1e6)
    return sorted(samples)


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def _row(n: int, seconds: float) -> str:
    strategy, views = _strategy(n)

    def decide(i: int) -> None:
        req = RouteRequest(model="m", prompt_tokens=100 + i)
        primary = strategy.select(views, req)
        # As the planner asks: the rest of the select's views, in their order.
        rest = [v for v in views if v is not primary]
        strategy.fallback_order(rest, req, after_select=True)

    cands = strategy.candidates(views, RouteRequest(model="m", prompt_tokens=100), time.time())
    costs = [c.effective_cost or 0.0 for c in cands]
    objective = cost_tiebroken_objective([c.latency_ms for c in cands], costs)
    budget = budget_for(costs, 0.5, [c.latency_ms for c in cands])
    decisions = _time(decide, seconds)
    hull = _time(lambda _i: solve_hull(costs, objective, budget), seconds / 4)
    library = _time(lambda _i: solve_with_library(costs, objective, budget), seconds / 4)
    return (
        f"| {n} | {_pct(decisions, 0.5):.0f} | {_pct(decisions, 0.99):.0f} | "
        f"{_pct(hull, 0.5):.0f} | {_pct(library, 0.5):.0f} |"
    )


def main(argv: list[str]) -> int:
    """Print one row per route count."""
    p = argparse.ArgumentParser(prog="bench decisions")
    p.add_argument("--routes", default="5,20,100")
    p.add_argument("--seconds", type=float, default=2.0)
    args = p.parse_args(argv)
    print("| routes | decision p50 µs | decision p99 µs | hull LP p50 µs | library LP p50 µs |")
    print("|---:|---:|---:|---:|---:|")
    for n in (int(x) for x in args.routes.split(",")):
        print(_row(n, args.seconds))
    return 0
