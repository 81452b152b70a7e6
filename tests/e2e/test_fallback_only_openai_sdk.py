"""``fallback_only`` routes through the real server with the openai SDK: a backup is never
drawn as primary (its weight is not used), takes over in declaration order when the drawn
route fails, and leads while the drawn route's circuit is open. ``inproc://`` and NATS."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.e2e.conftest import HI, STAYS_OPEN, circuit_events, config, eid, model, route
from tests.fixtures.upstream import Reply, UpstreamFactory

if TYPE_CHECKING:
    import openai

    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

REQUESTS = 30  # a backup drawn at its weight (1 of 3) is missed by all of them with p ~ 5e-6


async def _via(client: openai.AsyncOpenAI) -> str:
    raw = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
    return str(raw.headers["x-routed-via"])


async def test_fallback_only_routes_are_never_primary_and_take_over_in_declared_order(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = await fake_upstreams("a"), await fake_upstreams("b"), await fake_upstreams("c")
    gw = await gateway_factory(
        config(
            model("m", route(a), route(b, fallback_only=True), route(c, 5, fallback_only=True)),
            circuit=STAYS_OPEN,
            routing={"affinity": {"enabled": False}},
        )
    )
    client = gw.openai()

    healthy = {await _via(client) for _ in range(REQUESTS)}
    a.set_default(Reply(500))
    async with circuit_events(gw) as events:
        failed_over = [await _via(client) for _ in range(2)]
        await events.circuit("open", eid("m", a))
    served = len(a.requests)
    while_open = await _via(client)
    b.enqueue(Reply(500))
    past_both = await _via(client)

    assert healthy == {eid("m", a)}
    assert failed_over == [eid("m", b)] * 2
    assert (while_open, len(a.requests)) == (eid("m", b), served)
    assert past_both == eid("m", c)
    assert len(c.requests) == 1
