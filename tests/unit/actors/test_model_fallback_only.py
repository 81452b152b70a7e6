"""ModelActor's plan with ``fallback_only`` routes: never drawn as primary, after the drawn
routes in declaration order, and leading the plan (a half-open one as the probe) when no
drawn route is available."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from actors import ChildSpec, ModelActor, Supervisor
from schemas import ErrorCode, ErrorReply, ProbeGrant, ProbeRequest, subjects
from schemas.config import ModelConfig, RoutingConfig
from tests.unit.actors.test_model import DRAWS, A, B, C, Z, ask, plan, set_state, status

if TYPE_CHECKING:
    from bus import InProcessBus
    from tests.unit.actors import FakeClock

Start = Callable[..., Any]
BACKUP = {8002, 8009}  # B and Z are fallback_only in every test here


@pytest.fixture
async def start_model(bus: InProcessBus, clock: FakeClock) -> AsyncIterator[Start]:
    """``await start_model(port, ...)`` runs model ``m``: a weight-1 route per port, the ports
    in :data:`BACKUP` marked ``fallback_only``."""
    roots: list[Supervisor] = []

    async def start(*ports: int) -> None:
        cfg = ModelConfig.model_validate(
            {
                "id": "m",
                "route": [
                    {
                        "kind": "openai_compat",
                        "base_url": f"http://127.0.0.1:{port}/v1",
                        "provider_model_id": f"up-{port}",
                        "fallback_only": port in BACKUP,
                    }
                    for port in ports
                ],
            }
        )
        routing = RoutingConfig.model_validate({"affinity": {"enabled": False}})
        root = Supervisor(
            "test", children=[ChildSpec("model", lambda: ModelActor(cfg, routing, clock=clock))]
        )
        roots.append(root)
        await root.start(bus)

    yield start
    for root in reversed(roots):
        await root.stop()


def _order(p: Any) -> list[str]:
    return [c.endpoint for c in p.candidates]


async def test_fallback_only_routes_are_never_primary_and_follow_the_drawn_in_declared_order(
    bus: InProcessBus,
    start_model: Start,
) -> None:
    await start_model(8001, 8002, 8003, 8009)

    plans = [await plan(bus) for _ in range(DRAWS)]

    assert set(Counter(p.candidates[0].endpoint for p in plans)) == {A, C}
    for p in plans:
        assert _order(p)[2:] == [B, Z]


async def test_fallback_only_routes_lead_in_declared_order_when_no_drawn_route_is_available(
    bus: InProcessBus,
    clock: FakeClock,
    start_model: Start,
) -> None:
    await start_model(8001, 8002, 8003, 8009)
    await set_state(bus, A, "open", open_until=clock.now + 30)
    await set_state(bus, C, "open", open_until=clock.now + 30)

    both = await plan(bus)
    await set_state(bus, B, "open", open_until=clock.now + 30)
    last = await plan(bus)

    assert (_order(both), both.reason) == ([B, Z], "fallback_only")
    assert _order(last) == [Z]
    await set_state(bus, Z, "open", open_until=clock.now + 10)
    refused = await ask(bus)
    assert isinstance(refused, ErrorReply) and refused.code == ErrorCode.ALL_CIRCUITS_OPEN
    assert refused.retry_after == pytest.approx(10.0)


async def test_a_half_open_fallback_only_route_is_probed_when_it_is_needed(
    bus: InProcessBus,
    clock: FakeClock,
    start_model: Start,
) -> None:
    await start_model(8001, 8002)
    await set_state(bus, A, "open", open_until=clock.now + 60)
    await set_state(bus, B, "open", open_until=clock.now + 30)
    clock.now += 30

    async with bus.subscribe(subjects.endpoint_probe(B)) as sub, anyio.create_task_group() as tg:
        leases: list[ProbeRequest] = []

        async def owner() -> None:
            async for env in sub:
                leases.append(env.message)  # type: ignore[arg-type]
                await env.respond(ProbeGrant(granted=True))

        tg.start_soon(owner)
        probe = await plan(bus)
        tg.cancel_scope.cancel()

    assert [(c.endpoint, c.probe) for c in probe.candidates] == [(B, True)]
    assert len(leases) == 1


async def test_a_model_of_fallback_only_routes_serves_them_in_declared_order(
    bus: InProcessBus,
    start_model: Start,
) -> None:
    await start_model(8009, 8002)

    assert {tuple(_order(await plan(bus))) for _ in range(20)} == {(Z, B)}


async def test_a_fallback_only_route_reports_effective_weight_zero_and_its_configured_weight(
    bus: InProcessBus,
    start_model: Start,
) -> None:
    await start_model(8001, 8002)

    weights = {
        r.endpoint: (r.weight, r.configured_weight, r.fallback_only, r.overridden)
        for r in (await status(bus)).routes
    }

    # Marked as a backup, not overridden: the dashboard must not offer to "restore" it.
    assert weights == {A: (1.0, 1.0, False, False), B: (0.0, 1.0, True, False)}
