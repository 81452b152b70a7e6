"""A ModelActor's decision in steady traffic, ``fixed`` against ``routewise``, in this process.

    python -m tests.benchmarks.planner_steady [--routes 5] [--requests 20000] [--in-flight 32]

What ``pair.py mode --a fixed-5 --b routewise-5`` measures end to end, without HTTP, the bus
or a second process, in seconds and without the machine's minute in it: one model of
``--routes`` priced routes (as bench.py's ``fixed-5`` and ``routewise-5``), the planner a
ModelActor holds (route table, key views, affinity, prefill, load) and its strategy. Each
request is planned for one caller (the benchmark's load generator is one address, so the
``fixed`` draw answers from the caller's affinity pin, as there), its primary counted in
flight, and the answer of the request ``--in-flight`` before it observed (the load and the
strategy learn from it), on a clock that moves half a millisecond a request. RouteWise's
random draws are seeded, so two trees read the same decisions.

Prints, per strategy, the median over five runs of µs a request in the planner's decision
(with the load's count of the plan) and in the strategy's observation. Timed with
``perf_counter`` around each step, so both carry the same few hundred ns of timing.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from actors.keypool_view import KeyViews
from actors.model_load import ModelLoad
from actors.state.affinity import AffinityTable
from actors.state.cooling import CooledRoutes
from actors.state.planner import Decision, RoutePlanner
from actors.state.prefill import PrefillLoad
from actors.state.route_table import RouteTable
from actors.strategies import RoutingStrategy, StrategyDeps, build_strategy
from schemas import Observation, RouteRequest
from schemas.config import ModelConfig, RoutingConfig

_STEP_S = 0.0005  # the clock between two requests
_WARM_UP = 2000
_RUNS = 5


_Planned = tuple[RoutePlanner, ModelLoad, RoutingStrategy, list[float]]


def _planner(router: str, routes: int) -> _Planned:
    """A planner over one model of ``routes`` priced routes under ``router``, and its clock."""
    model = ModelConfig.model_validate(
        {
            "id": "m",
            "router": router,
            "router_params": {"random_seed": 7} if router == "routewise" else {},
            "route": [
                {
                    "kind": "openai_compat",
                    "base_url": "http://127.0.0.1:9/v1",
                    "provider_model_id": f"up-{i}",
                    "api_key": "sk-bench",
                    "pricing": {"prompt": 0.1 * (i + 1), "completion": 0.4 * (i + 1)},
                }
                for i in range(routes)
            ],
        }
    )
    routing = RoutingConfig.model_validate({})
    clock = [1000.0]

    def now() -> float:
        return clock[0]

    load = ModelLoad(model, routing, now)
    strategy = build_strategy(
        router, model.router_params, StrategyDeps(model=model, clock=now, load=load.of)
    )
    planner = RoutePlanner(
        model,
        routing,
        table=RouteTable(model, routing, fixed=router == "fixed"),
        keys=KeyViews(model, routing.key_pool),
        cooled=CooledRoutes(),
        affinity=AffinityTable(300.0, 1000),
        prefill=PrefillLoad(elephant_tokens=200_000, hint_ttl=60.0),
        load=load,
        strategy=strategy,
        host=None,
        router=router,
        spills=False,
        pins_changed=lambda: None,
    )
    return planner, load, strategy, clock


def _run(router: str, routes: int, requests: int, in_flight: int) -> tuple[float, float]:
    """(µs a request deciding, µs a request observing) over ``requests`` after a warm-up."""
    planner, load, strategy, clock = _planner(router, routes)
    rng = random.Random(1)
    flying: list[tuple[str, str]] = []
    deciding = observing = 0.0
    full: frozenset[str] = frozenset()
    clock_ = time.perf_counter
    for i in range(_WARM_UP + requests):
        clock[0] += _STEP_S
        req = RouteRequest(model="m", prompt_tokens=20, caller="ip:1", request_id=f"r{i}")
        t0 = clock_()
        planning = planner.decide(req, full, clock[0])
        try:
            next(planning)
            raise RuntimeError("a closed route asked for a probe lease")
        except StopIteration as done:
            decision: Decision = done.value
        load.issued(req.request_id, decision.plan, clock[0], req)
        t1 = clock_()
        flying.append((req.request_id, decision.plan.candidates[0].endpoint))
        if len(flying) > in_flight:
            request_id, endpoint = flying.pop(0)
            obs = Observation(
                request_id=request_id,
                endpoint=endpoint,
                model="m",
                outcome="success",
                ttft_ms=rng.uniform(2.0, 3.0),
                latency_ms=3.0,
                prompt_tokens=20,
                completion_tokens=10,
                ts=clock[0],
            )
            load.observed(obs, clock[0])
            t2 = clock_()
            strategy.observe(obs)
            if i >= _WARM_UP:
                observing += clock_() - t2
        if i >= _WARM_UP:
            deciding += t1 - t0
    return deciding / requests * 1e6, observing / requests * 1e6


def main(argv: list[str] | None = None) -> int:
    """Print one row per strategy."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--routes", type=int, default=5)
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--in-flight", type=int, default=32)
    args = p.parse_args(argv)
    print(f"| strategy ({args.routes} routes) | decide µs/req | observe µs/req | sum |")
    print("|---|---:|---:|---:|")
    for router in ("fixed", "routewise"):
        runs = [_run(router, args.routes, args.requests, args.in_flight) for _ in range(_RUNS)]
        decide = statistics.median(r[0] for r in runs)
        observe = statistics.median(r[1] for r in runs)
        print(f"| {router} | {decide:.2f} | {observe:.2f} | {decide + observe:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
