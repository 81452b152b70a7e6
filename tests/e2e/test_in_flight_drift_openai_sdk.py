"""The ModelActor's count of each route's requests in flight (load-aware selection) after
requests that end on a route the count had already moved past: nothing may stay counted on a
candidate that was never sent (it would stay there until the count's TTL, minutes, and steer
traffic away from an idle route)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import openai
import pytest

from tests.e2e.conftest import HI, config, eid, model, route, settled_in_flight
from tests.e2e.keys_support import SLOW_CIRCUIT, keys_config
from tests.fixtures.upstream import Reply, Stream

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = pytest.mark.e2e

A, B = "sk-upstream-aaaa", "sk-upstream-bbbb"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_request_served_on_its_routes_next_key_leaves_no_fallback_counted(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, tmp_path: Path, stream: bool
) -> None:
    up, spare = await fake_upstreams("up"), await fake_upstreams("spare")
    up.key_behaviours[A] = Reply(401)
    gw = await gateway_factory(
        keys_config(
            tmp_path, model("m", route(up, api_keys=[A, B]), route(spare, fallback_only=True))
        )
    )
    client = gw.openai()
    if stream:
        chunks = await client.chat.completions.create(model="m", messages=HI, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    else:
        answer = await client.chat.completions.create(model="m", messages=HI)
        text = answer.choices[0].message.content or ""
    assert text == up.text and not spare.requests  # served by the route's other key

    assert await settled_in_flight(gw) == {eid("m", up): 0, eid("m", spare): 0}


async def test_a_candidate_the_spent_budget_never_sends_is_not_left_counted(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    a, b, c = await fake_upstreams("a"), await fake_upstreams("b"), await fake_upstreams("c")
    a.set_default(Reply(500))
    b.set_default(Reply(503, delay=0.5))  # the first retry ends after the 0.3 s budget
    gw = await gateway_factory(
        config(
            model("m", route(a), route(b, fallback_only=True), route(c, fallback_only=True)),
            circuit=SLOW_CIRCUIT,
            routing={"bench": {"failures": 50}, "failover": {"budget_seconds": 0.3}},
        )
    )
    with pytest.raises(openai.APIStatusError):
        await gw.openai().chat.completions.create(model="m", messages=HI)
    assert not c.requests  # the budget ran out: c is given back, never sent

    assert await settled_in_flight(gw) == {eid("m", a): 0, eid("m", b): 0, eid("m", c): 0}


async def test_a_stream_that_breaks_after_its_first_chunk_leaves_no_fallback_counted(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    # The answer had begun: the client gets the dialect's error and no other route is tried,
    # so nothing may stay counted on the fallback (under load such counts piled up past every
    # route's limit and the gateway refused requests with healthy routes idle).
    up, spare = await fake_upstreams("up"), await fake_upstreams("spare")
    up.enqueue(Stream(chunks=5, cut_after=2))
    gw = await gateway_factory(config(model("m", route(up), route(spare, fallback_only=True))))
    chunks = await gw.openai().chat.completions.create(model="m", messages=HI, stream=True)
    with pytest.raises(openai.APIError):
        async for _ in chunks:
            pass
    assert not spare.requests

    assert await settled_in_flight(gw) == {eid("m", up): 0, eid("m", spare): 0}
