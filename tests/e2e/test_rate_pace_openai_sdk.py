"""Pacing through the real server with the openai SDK, on both buses: a route whose answers
(streamed or whole) report its provider's request rate limit (OpenAI's
``x-ratelimit-{limit,remaining,reset}-requests``, Anthropic's ``anthropic-ratelimit-
requests-*``) is sent no request once the requests that limit has left are spent: the next
goes to the fallback instead of drawing the provider's 429, and ``/health/deep`` says until
when.

The fake provider enforces a real limit of two requests a second on loopback, and its answers
report a limit of two, one back every 10 s (so that nothing here races a refill); the three
requests are sent one after another, so nothing waits on time.
"""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING

import pytest

from tests.e2e.conftest import HI, anthropic_route, config, model, route
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = pytest.mark.e2e


def _reported(remaining: int, kind: str) -> Reply:
    """The normal answer, reporting a limit of 2 with ``remaining`` left, one coming back
    every 10 s, as ``kind``'s provider does (OpenAI: when all is back, a duration;
    Anthropic: a time)."""
    all_back = (2 - remaining) * 10
    if kind == "anthropic":
        back = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=all_back)
        headers = {
            "anthropic-ratelimit-requests-limit": "2",
            "anthropic-ratelimit-requests-remaining": str(remaining),
            "anthropic-ratelimit-requests-reset": back.isoformat(),
        }
    else:
        headers = {
            "x-ratelimit-limit-requests": "2",
            "x-ratelimit-remaining-requests": str(remaining),
            "x-ratelimit-reset-requests": f"{all_back}s",
        }
    return Reply(headers=headers)


@pytest.mark.parametrize(
    ("pacing", "stream", "kind"),
    [
        (True, True, "openai_compat"),
        (True, False, "openai_compat"),
        (False, True, "openai_compat"),
        (True, True, "anthropic"),
        (True, False, "anthropic"),
    ],
)
async def test_a_route_whose_reported_limit_is_spent_is_passed_over_before_its_provider_refuses(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    pacing: bool,
    stream: bool,
    kind: str,
) -> None:
    paced = await fake_upstreams("paced", rate_limit=2)
    paced.enqueue(_reported(1, kind), _reported(0, kind))
    spare = await fake_upstreams("spare")
    first = anthropic_route(paced) if kind == "anthropic" else route(paced)
    cfg = config(model("m", first, route(spare, fallback_only=True)))
    cfg["routing"] = {"learned_capacity": {"pace_rate_limits": pacing}}
    gw = await gateway_factory(cfg)
    client = gw.openai()

    served = []
    for _ in range(3):
        if stream:
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=HI, stream=True
            )
            async for _chunk in raw.parse():
                pass
        else:
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
            assert "_rate_report" not in raw.text  # the marker never reaches the client
        served.append(raw.headers["x-routed-via"])
    deep = (await gw.http().get("/health/deep")).json()
    paced_load = deep["load"]["m"][served[0]]

    assert served[:2] == [served[0]] * 2 and served[2] != served[0]
    # Paced, the third request never reached the provider; unpaced, it drew the 429 first.
    assert len(paced.refused) == (0 if pacing else 1)
    assert len(paced.requests) - len(paced.refused) == 2 and len(spare.requests) == 1
    # Operators see until when: the next request comes back within 10 s.
    if pacing:
        assert time.time() < paced_load["rate_limit_until"] <= time.time() + 10.0
    else:
        assert paced_load["rate_limit_until"] is None
