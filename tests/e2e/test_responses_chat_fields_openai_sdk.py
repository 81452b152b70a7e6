"""The Responses request fields chat takes under the same name and meaning reach the route as
a chat client's do, through the official ``openai`` SDK: ``prompt_cache_key`` (Codex CLI keys
its prompt cache by conversation with it), ``prompt_cache_retention``, ``safety_identifier``,
``service_tier`` and ``text.verbosity`` (chat's ``verbosity``), plain and streamed. They were
dropped: the upstream's prompt cache missed, abuse was charged to the organisation, a ``flex``
request was billed at the default tier. Claude gets ``safety_identifier`` as
``metadata.user_id``, as a chat client's. The answer echoes the key and the identifier, and
each setting the request left out as OpenAI's API echoes it (``temperature`` 1.0, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import ONE_BUS, anthropic_route, config, model, route

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

SAME_IN_CHAT: dict[str, Any] = {
    "prompt_cache_key": "0199a213-81c0-7800-8aa1-bbab2a035a53",
    "prompt_cache_retention": "24h",
    "safety_identifier": "user-7f3a",
    "service_tier": "flex",
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_responses_fields_chat_takes_reach_an_openai_compat_route_under_chats_names(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, stream: bool
) -> None:
    client = (await gateway_factory(config(model("m", route(fake_upstream))))).openai()
    ask: dict[str, Any] = {"model": "m", "input": "hi", "text": {"verbosity": "low"}}

    if stream:
        async with client.responses.stream(**ask, **SAME_IN_CHAT) as events:
            answer = await events.get_final_response()
    else:
        answer = await client.responses.create(**ask, **SAME_IN_CHAT)

    sent = fake_upstream.requests[-1].json
    assert {key: sent.get(key) for key in SAME_IN_CHAT} == SAME_IN_CHAT
    assert sent["verbosity"] == "low"
    assert answer.prompt_cache_key == SAME_IN_CHAT["prompt_cache_key"]
    assert answer.safety_identifier == SAME_IN_CHAT["safety_identifier"]


async def test_a_responses_safety_identifier_reaches_claude_as_its_user_id(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    client = (await gateway_factory(config(model("m", anthropic_route(fake_upstream))))).openai()

    await client.responses.create(model="m", input="hi", **SAME_IN_CHAT)

    sent = fake_upstream.requests[-1].json
    assert sent["metadata"] == {"user_id": "user-7f3a"}
    assert "prompt_cache_key" not in sent and "service_tier" not in sent


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_responses_answer_echoes_settings_left_out_as_openai_does(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, stream: bool
) -> None:
    # They were null or missing: a client reading ``response.temperature`` (or ``top_p``,
    # ``reasoning``, ``service_tier``) saw what OpenAI never answers.
    client = (await gateway_factory(config(model("m", route(fake_upstream))))).openai()

    if stream:
        async with client.responses.stream(model="m", input="hi") as events:
            answer = await events.get_final_response()
    else:
        answer = await client.responses.create(model="m", input="hi")

    assert (answer.temperature, answer.top_p, answer.top_logprobs) == (1.0, 1.0, 0)
    assert (answer.tool_choice, answer.tools, answer.parallel_tool_calls) == ("auto", [], True)
    assert (answer.background, answer.truncation) == (False, "disabled")
    assert (answer.metadata, answer.service_tier, answer.max_output_tokens) == ({}, "default", None)
    assert answer.reasoning is not None and answer.reasoning.effort is None
    assert answer.text is not None and answer.text.format is not None
    assert (answer.text.format.type, answer.text.verbosity) == ("text", "medium")
