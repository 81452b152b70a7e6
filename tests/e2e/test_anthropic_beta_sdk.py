"""A Messages client's ``anthropic-beta`` flags reach an ``anthropic`` route, and only it.

Claude Code sends its feature flags in ``anthropic-beta`` (``context-1m-...`` for a 1M-token
window, ``interleaved-thinking-...`` for thinking between tool calls): without them Claude
refuses a prompt over 200k tokens and thinks only before its tool calls, so the gateway
sends them on to an ``anthropic`` route as the client sent them; an ``openai_compat`` route
never sees them. Through the official ``anthropic`` SDK's beta client, against the
scriptable fake upstream, on the in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.e2e.conftest import ONE_BUS, anthropic_route, config, model, route

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

BETAS = ["context-1m-2025-08-07", "interleaved-thinking-2025-05-14"]


async def test_messages_client_beta_flags_reach_an_anthropic_route_only(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    claude, oa = await fake_upstreams("claude"), await fake_upstreams("oa")
    gw = await gateway_factory(config(model("m", anthropic_route(claude)), model("o", route(oa))))
    client = gw.anthropic()

    for name in ("m", "o"):
        await client.beta.messages.create(
            model=name, max_tokens=10, messages=[{"role": "user", "content": "hi"}], betas=BETAS
        )

    assert claude.requests[-1].headers["anthropic-beta"] == ",".join(BETAS)
    assert "_anthropic_beta" not in oa.requests[-1].json
    assert "anthropic-beta" not in oa.requests[-1].headers
