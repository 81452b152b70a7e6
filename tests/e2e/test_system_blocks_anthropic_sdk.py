"""A Messages client's system blocks reach a Gemini route with their boundary kept.

Claude Code sends its system prompt as several text blocks, marked for caching. Unmarked,
the blocks became one prompt with a blank line between them on every route; marked, a
``gemini`` route got them run together (``...for Claude.You are an interactive...``), so a
cache mark changed the prompt a non-Claude model read. Now Gemini's ``systemInstruction``
holds the same text either way. Through the official ``anthropic`` SDK against the
scriptable fake upstream, on the in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import HI, ONE_BUS, config, model

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

FIRST = "You are a coding agent."
SECOND = "Answer briefly."


@pytest.mark.parametrize("marked", [False, True], ids=["unmarked", "marked_for_caching"])
async def test_system_blocks_reach_gemini_with_a_blank_line_between(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, marked: bool
) -> None:
    gemini = {"kind": "gemini", "base_url": fake_upstream.gemini_base_url}
    gw = await gateway_factory(config(model("m", {**gemini, "provider_model_id": "gemini-x"})))
    first: dict[str, Any] = {"type": "text", "text": FIRST}
    if marked:
        first["cache_control"] = {"type": "ephemeral"}
    system: Any = [first, {"type": "text", "text": SECOND}]

    await gw.anthropic().messages.create(model="m", max_tokens=9, system=system, messages=HI)

    instruction = fake_upstream.requests[-1].json["systemInstruction"]
    assert instruction == {"parts": [{"text": f"{FIRST}\n\n{SECOND}"}]}
