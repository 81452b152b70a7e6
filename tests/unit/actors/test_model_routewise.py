"""A ModelActor hosting ``routewise`` on the in-process bus: the request log replayed from
the StoreActor at startup (over the bus, with the rows' own timestamps), the pool owner's
state pricing a capacity route (the one view the lease uses too), and plans whose fallbacks
follow the LP."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import pytest

from actors import CapacityActor, ChildSpec, ModelActor, StoreActor, Supervisor
from schemas import (
    CapacityRelease,
    LogAppend,
    ModelStatus,
    ModelStatusRequest,
    Observation,
    RoutePlan,
    RouteRequest,
    subjects,
)
from schemas.capacity import capacity_pools
from schemas.config import GatewayConfig, LogConfig, ModelConfig, RoutingConfig
from schemas.routing import RateReport
from tests.unit.actors import WAIT, FakeClock

if TYPE_CHECKING:
    from pathlib import Path

    from bus import InProcessBus

CHEAP = {"prompt": 0.1, "completion": 0.2}
DEAR = {"prompt": 5.0, "completion": 20.0}


def route(port: int, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "openai_compat",
        "base_url": f"http://127.0.0.1:{port}/v1",
        "provider_model_id": f"up-{port}",
        **extra,
    }


def ep(port: int) -> str:
    return f"m:local-{port}"


Start = Callable[..., Any]


@pytest.fixture
async def start_model(bus: InProcessBus, clock: FakeClock) -> AsyncIterator[Start]:
    roots: list[Supervisor] = []

    async def start(*routes: dict[str, Any], capacity: bool = False, **params: Any) -> ModelActor:
        # In-band exploration would send one request in twenty to an unprofiled route at
        # random; these tests check the LP's own choice.
        params.setdefault("explore_unprofiled_share", 0)
        cfg = ModelConfig.model_validate(
            {"id": "m", "router": "routewise", "router_params": params, "route": list(routes)}
        )
        routing = RoutingConfig()
        # With ``capacity``: the pools' owners run too (before the model, which seeds from them).
        owners = (
            [
                ChildSpec(
                    f"capacity:{name}",
                    functools.partial(CapacityActor, spec, routing.leases, clock=clock),
                )
                for name, spec in capacity_pools(GatewayConfig(models=[cfg])).items()
            ]
            if capacity
            else []
        )
        root = Supervisor(
            "test",
            children=[*owners, ChildSpec("model", lambda: ModelActor(cfg, routing, clock=clock))],
        )
        roots.append(root)
        await root.start(bus)
        actor = root.child("model")
        assert isinstance(actor, ModelActor)
        return actor

    yield start
    for root in reversed(roots):
        await root.stop()


async def status(bus: InProcessBus) -> ModelStatus:
    reply = await bus.request(
        subjects.model_status("m"), ModelStatusRequest(), reply_type=ModelStatus, timeout=WAIT
    )
    assert isinstance(reply, ModelStatus), reply
    return reply


async def plan(bus: InProcessBus, **kw: Any) -> RoutePlan:
    reply = await bus.request(
        subjects.model_route("m"), RouteRequest(model="m", **kw), reply_type=RoutePlan, timeout=WAIT
    )
    assert isinstance(reply, RoutePlan), reply
    return reply


def success(port: int, ttft_ms: float, ts: float) -> Observation:
    return Observation(
        endpoint=ep(port),
        model="m",
        outcome="success",
        ttft_ms=ttft_ms,
        prompt_tokens=1000,
        completion_tokens=50,
        ts=ts,
        request_id="r",
    )


async def test_routewise_model_bootstraps_latency_from_the_request_log(
    bus: InProcessBus,
    clock: FakeClock,
    start_model: Start,
    tmp_path: Path,
) -> None:
    clock.now = time.time()
    store = StoreActor(str(tmp_path / "log.db"), LogConfig(flush_ms=10_000))
    async with anyio.create_task_group() as tg:
        await tg.start(store.run, bus)
        seen = [success(8001, 2500.0, clock.now - 120), success(8002, 200.0, clock.now - 60)] * 3
        # the rows an ingress sends the store (see gateway.ingress.accounting)
        await bus.publish(
            subjects.LOG_APPEND, LogAppend(sender="ingress-1", seq=1, attempts=tuple(seen))
        )
        await start_model(route(8001, pricing=CHEAP), route(8002, pricing=DEAR), budget_alpha=1.0)
        rows = {c.endpoint: c for c in (await status(bus)).routewise}
        first = await plan(bus, prompt_tokens=100)
        store.request_stop()

    assert rows[ep(8001)].profiled and rows[ep(8001)].latency_ms == pytest.approx(2500.0)
    assert rows[ep(8002)].latency_ms == pytest.approx(200.0)
    assert first.candidates[0].endpoint == ep(8002)  # alpha 1: the fast one, from history


async def test_routewise_model_without_a_store_starts_with_no_evidence(
    bus: InProcessBus,
    start_model: Start,
) -> None:
    await start_model(route(8001, pricing=CHEAP), route(8002, pricing=DEAR))
    st = await status(bus)
    assert [c.profiled for c in st.routewise] == [False, False]
    # no evidence: equal latency, the tie goes to the cheaper route
    assert (await plan(bus)).candidates[0].endpoint == ep(8001)


async def test_routewise_model_prices_capacity_from_the_pool_owner_and_leases_its_pick(
    bus: InProcessBus,
    start_model: Start,
) -> None:
    conc = route(8002, provider_type="concurrency", concurrency={"limit": 1})
    await start_model(route(8001, pricing=DEAR), conc, capacity=True)
    first = await plan(bus, request_id="r1")
    # Free beats dear, and the decision leased the pool's only slot for it.
    assert first.candidates[0].endpoint == ep(8002) and first.candidates[0].lease_id
    rows = {c.endpoint: c for c in (await status(bus)).routewise}
    assert rows[ep(8002)].excluded == "concurrency_full" and rows[ep(8002)].free_slots == 0
    second = await plan(bus, request_id="r2")
    assert [c.endpoint for c in second.candidates] == [ep(8001)]
    assert not second.candidates[0].lease_id
    # The slot given back: the owner's CapacityState reaches the view, the route is free.
    await bus.publish(
        subjects.capacity_release(ep(8002)),
        CapacityRelease(pool=ep(8002), lease_id=first.candidates[0].lease_id),
    )
    with anyio.fail_after(WAIT):
        while True:  # a bounded loop of awaited status requests while the event lands
            rows = {c.endpoint: c for c in (await status(bus)).routewise}
            if not rows[ep(8002)].excluded:
                break
    assert rows[ep(8002)].free_slots == 1
    assert (await plan(bus, request_id="r3")).candidates[0].endpoint == ep(8002)


async def test_routewise_plan_orders_fallbacks_by_the_re_solved_lp(
    bus: InProcessBus,
    clock: FakeClock,
    start_model: Start,
) -> None:
    await start_model(
        route(8001, pricing=CHEAP),
        route(8002, pricing=DEAR),
        route(8003, pricing={"prompt": 1.0, "completion": 4.0}),
        budget_alpha=1.0,
    )
    for port, ms in ((8001, 3000.0), (8002, 100.0), (8003, 700.0)):
        await bus.publish(subjects.observation(ep(port)), success(port, ms, clock.now))
    with anyio.fail_after(WAIT):
        while not all(c.profiled for c in (await status(bus)).routewise):
            pass
    p = await plan(bus, prompt_tokens=500)
    assert [c.endpoint for c in p.candidates] == [ep(8002), ep(8003), ep(8001)]
    assert p.reason == "routewise"


async def test_routewise_strict_fallback_mode_plans_one_route(
    bus: InProcessBus,
    start_model: Start,
) -> None:
    await start_model(route(8001, pricing=CHEAP), route(8002, pricing=DEAR), fallback_mode="strict")
    assert len((await plan(bus)).candidates) == 1


async def test_routewise_leaves_out_a_route_whose_token_limit_a_request_would_overdraw(
    bus: InProcessBus,
    start_model: Start,
) -> None:
    await start_model(route(8001, pricing=CHEAP), route(8002, pricing=DEAR))
    assert (await plan(bus, request_id="r0")).candidates[0].endpoint == ep(8001)  # cheaper
    # Its answer: 1,000 prompt and 50 output tokens; 2,000 of a 100,000 token limit left,
    # all of it back in a minute.
    tokens = RateReport(limit=100_000, remaining=2_000, reset_seconds=60.0)
    said = msgspec.structs.replace(
        success(8001, 300.0, 0.0),
        request_id="r0",
        rate=RateReport(limit=500, remaining=499, reset_seconds=0.1, tokens=tokens),
    )
    await bus.publish(subjects.observation(ep(8001)), said)
    short = await plan(bus, dry=True, prompt_tokens=1_500)  # room for 1,600: fits
    long = await plan(bus, dry=True, prompt_tokens=5_000)  # 5,100: does not

    assert short.candidates[0].endpoint == ep(8001)
    assert [c.endpoint for c in long.candidates] == [ep(8002), ep(8001)]
    assert long.skipped[0].endpoint == ep(8001) and long.skipped[0].reason == "rate_limit"
