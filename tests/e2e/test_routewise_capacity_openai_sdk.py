"""RouteWise and the capacity owners as one mechanism, through the real server with the
openai SDK, on both buses: a ``router: routewise`` model with a ``concurrency: {limit: 1}``
route (free while its slot is free) and a priced on-demand route. While one request holds
the slot (the fake upstream holds it open), the decision's lease on the concurrency route is
refused or its pool is seen full, so RouteWise re-solves without it and the next request goes
to the on-demand route; once the slot is given back, the pool owner's state reaches the
ModelActor's capacity view and the concurrency route serves again.

Nothing is timed: the test awaits the pool's CapacityState events, the held request's
arrival at the upstream and the ModelActor's status.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import anyio
import pytest

from schemas import CapacityState, ModelStatus, ModelStatusRequest, subjects
from tests.e2e.conftest import HI, WAIT, config, eid, gateway_bus, model, route, watch
from tests.fixtures.upstream import Held

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = pytest.mark.e2e

DEAR = {"prompt": 5.0, "completion": 20.0}
CHAT = "/v1/chat/completions"


async def _free_slots_seen(gw: RunningGateway, endpoint: str, free: float) -> None:
    """Return once the ModelActor's RouteWise rows show ``free`` slots on ``endpoint`` (a
    bounded loop of awaited status requests while the CapacityState event lands)."""
    with anyio.fail_after(WAIT):
        while True:
            st = await gateway_bus(gw).request(
                subjects.model_status("m"),
                ModelStatusRequest(),
                reply_type=ModelStatus,
                timeout=WAIT,
            )
            assert isinstance(st, ModelStatus), st
            rows = {c.endpoint: c for c in st.routewise}
            if rows[endpoint].free_slots == free:
                return


async def test_routewise_spills_to_on_demand_while_the_slot_is_held_and_returns_after(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    slot, paid = await fake_upstreams("slot"), await fake_upstreams("paid")
    gw = await gateway_factory(
        config(
            model(
                "m",
                route(slot, provider_type="concurrency", concurrency={"limit": 1}),
                route(paid, pricing=DEAR),
                router="routewise",
                router_params={"budget_alpha": 0.0, "random_seed": 1},
            ),
            routing={"affinity": {"enabled": False}},
        )
    )
    pool, on_demand = eid("m", slot), eid("m", paid)
    client = gw.openai()

    async def served_by() -> str:
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
        return str(raw.headers["x-routed-via"])

    slot.enqueue(Held())
    async with watch(gw, subjects.capacity_state(pool)) as states:
        # The free slot is the cheapest candidate: RouteWise picks it and the lease takes it.
        holding = asyncio.create_task(served_by())
        await slot.wait_for_requests(1)
        await states.next(CapacityState, lambda s: s.used == 1)
        # The slot is held: the next request goes to the on-demand route.
        spilled = [await served_by() for _ in range(2)]
        assert len(slot.requests_to(CHAT)) == 1 and len(paid.requests_to(CHAT)) == 2
        slot.release_held()
        assert await holding == pool
        await states.next(CapacityState, lambda s: s.used == 0)
    await _free_slots_seen(gw, pool, 1)
    resumed = await served_by()

    assert spilled == [on_demand, on_demand]
    assert resumed == pool
    assert slot.max_in_flight == 1
    assert len(slot.requests_to(CHAT)) == 2 and len(paid.requests_to(CHAT)) == 2
