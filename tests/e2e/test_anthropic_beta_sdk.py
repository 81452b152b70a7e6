"""A Messages client's ``anthropic-beta`` flags reach an ``anthropic`` route, the ones Bedrock
documents reach Claude on a ``bedrock`` route, and no other route sees them.

Claude Code sends its feature flags in ``anthropic-beta`` (``context-1m-...`` for a 1M-token
window, ``interleaved-thinking-...`` for thinking between tool calls): without them Claude
refuses a prompt over 200k tokens and thinks only before its tool calls, so the gateway
sends them on to an ``anthropic`` route as the client sent them; an ``openai_compat`` route
never sees them. Bedrock takes them in the body (``additionalModelRequestFields.anthropic_beta``)
and refuses the whole request for a flag it does not know (Claude Code's ``claude-code-...``):
only the documented ones go there. Through the official ``anthropic`` SDK's beta client, against the
scriptable fake upstream, on the in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.e2e.conftest import ONE_BUS, anthropic_route, config, model, route
from tests.e2e.test_bedrock_surfaces_sdk import bedrock_route

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import UpstreamFactory
    from tests.fixtures.upstream_bedrock import FakeBedrock

pytestmark = [pytest.mark.e2e, ONE_BUS]

BETAS = ["context-1m-2025-08-07", "interleaved-thinking-2025-05-14"]


async def test_messages_client_beta_flags_reach_an_anthropic_route_bedrock_the_documented(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, fake_bedrock: FakeBedrock
) -> None:
    claude, oa = await fake_upstreams("claude"), await fake_upstreams("oa")
    models = model("m", anthropic_route(claude)), model("o", route(oa))
    gw = await gateway_factory(config(*models, model("b", bedrock_route(fake_bedrock))))
    client = gw.anthropic()

    for name in ("m", "o", "b"):
        await client.beta.messages.create(
            model=name,
            max_tokens=10,
            messages=[{"role": "user", "content": "hi"}],
            betas=[*BETAS, "claude-code-20250219"],
        )

    assert claude.requests[-1].headers["anthropic-beta"] == ",".join(
        [*BETAS, "claude-code-20250219"]
    )
    assert "_anthropic_beta" not in oa.requests[-1].json
    assert "anthropic-beta" not in oa.requests[-1].headers
    sent = fake_bedrock.requests[-1]
    assert sent.json["additionalModelRequestFields"] == {"anthropic_beta": BETAS}
    assert "anthropic-beta" not in sent.headers
