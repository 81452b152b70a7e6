"""A fallback whose capacity pool refuses it is never sent: the ModelActor's count of that
route's requests in flight must not keep it (it counts the next candidate as sent once the
primary failed, until the ingress says it was not).

The primary hangs until its own timeout; meanwhile another holder takes the fallback's one
slot, so the failover loop finds the pool full and skips the route.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import openai
import pytest

from schemas import (
    CapacityAcquire,
    CapacityGrant,
    CapacityState,
    subjects,
)
from tests.e2e.conftest import (
    HI,
    WAIT,
    config,
    eid,
    gateway_bus,
    model,
    route,
    settled_in_flight,
    watch,
)
from tests.fixtures.upstream import Hang

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = pytest.mark.e2e

PRIMARY_TIMEOUT = 2.0  # long enough for the test to take the fallback's slot first


async def test_a_fallback_its_pool_refuses_is_not_left_counted_in_flight(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    first, slot = await fake_upstreams("first"), await fake_upstreams("slot")
    first.set_default(Hang())
    gw = await gateway_factory(
        config(
            model(
                "m",
                route(first, timeout_seconds=PRIMARY_TIMEOUT),
                route(
                    slot,
                    fallback_only=True,
                    provider_type="concurrency",
                    concurrency={"limit": 1},
                ),
            )
        )
    )
    pool = eid("m", slot)
    client = gw.openai()
    async with anyio.create_task_group() as tg, watch(gw, subjects.capacity_state(pool)) as states:
        failed: list[BaseException] = []

        async def ask() -> None:
            try:
                await client.chat.completions.create(model="m", messages=HI)
            except openai.APIStatusError as exc:
                failed.append(exc)

        tg.start_soon(ask)
        await first.wait_for_requests(1)  # planned with the slot free, now on its primary
        grant = await gateway_bus(gw).request(
            subjects.capacity_acquire(pool),
            CapacityAcquire(pool=pool, endpoint=pool, request_id="other", holder="test"),
            reply_type=CapacityGrant,
            timeout=WAIT,
        )
        assert isinstance(grant, CapacityGrant) and grant.granted
        await states.next(CapacityState, lambda s: s.used == 1)
    assert len(failed) == 1 and not slot.requests  # the fallback was skipped, never sent

    assert await settled_in_flight(gw) == {eid("m", first): 0, pool: 0}
