"""An upstream's refusal of the request reaches an OpenAI client with the upstream's own
``error.code``, as calling the provider directly would give it: clients act on it (Codex
compacts its history on ``context_length_exceeded``, others retry with a smaller prompt).
A code that is not an identifier (prose, a redacted credential) is not shown. Against the
scriptable fake upstream, through the official openai SDK, on the in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import openai
import pytest

from tests.e2e.conftest import (
    HI,
    ONE_BUS,
    anthropic_route,
    assert_openai_error,
    config,
    model,
    route,
)
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

TOO_LONG = "This model's maximum context length is 8000 tokens."


def _refusal(code: str, message: str = TOO_LONG) -> Reply:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return Reply(400, body={"error": error})


async def test_context_length_refusal_keeps_its_code_on_chat_and_responses(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(_refusal("context_length_exceeded"), _refusal("context_length_exceeded"))
    gw = await gateway_factory(config(model("m", route(fake_upstream))))
    client = gw.openai()

    with pytest.raises(openai.BadRequestError) as chat:
        await client.chat.completions.create(model="m", messages=HI)
    with pytest.raises(openai.BadRequestError) as responses:
        await client.responses.create(model="m", input="hi")

    for refused in (chat.value, responses.value):
        assert refused.code == "context_length_exceeded"
        err = assert_openai_error(refused.response, 400, "context_length_exceeded")
        assert err["message"] == TOO_LONG


CLAUDE_TOO_LONG = "prompt is too long: 210000 tokens > 200000 maximum"


async def test_claudes_context_length_refusal_reaches_openai_clients_as_openais_code(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # Claude's refusal has no code: it showed as upstream_error, so a Codex or LangChain
    # client behind an anthropic route never learnt that its history must shrink.
    error = {"type": "invalid_request_error", "message": CLAUDE_TOO_LONG}
    too_long = Reply(400, body={"type": "error", "error": error})
    fake_upstream.enqueue(too_long, too_long, too_long)
    client = (await gateway_factory(config(model("m", anthropic_route(fake_upstream))))).openai()

    with pytest.raises(openai.BadRequestError) as chat:
        await client.chat.completions.create(model="m", messages=HI)
    with pytest.raises(openai.BadRequestError) as responses:
        await client.responses.create(model="m", input="hi")
    with pytest.raises(openai.BadRequestError) as streamed:
        async with client.responses.stream(model="m", input="hi") as events:
            await events.until_done()

    for refused in (chat.value, responses.value, streamed.value):
        err = assert_openai_error(refused.response, 400, "context_length_exceeded")
        assert err["message"] == CLAUDE_TOO_LONG


async def test_upstream_code_that_is_not_an_identifier_is_not_shown(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(
        _refusal("bad request: see the docs", "Invalid request."),
        _refusal("Bearer sk-upstream-secret", "Invalid request."),
    )
    gw = await gateway_factory(config(model("m", route(fake_upstream))))

    for _ in range(2):
        with pytest.raises(openai.BadRequestError) as refused:
            await gw.openai().chat.completions.create(model="m", messages=HI)
        assert_openai_error(refused.value.response, 400, "upstream_error")
        assert "sk-upstream-secret" not in refused.value.response.text


async def test_upstream_param_that_names_a_field_reaches_a_chat_client(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    bad = {"message": "Invalid value: 'x'.", "type": "invalid_request_error", "code": None}
    fake_upstream.enqueue(
        Reply(400, body={"error": {**bad, "param": "messages[0].content[0].type"}}),
        Reply(400, body={"error": {**bad, "param": "see the docs: Bearer sk-upstream-secret"}}),
    )
    gw = await gateway_factory(config(model("m", route(fake_upstream))))

    params = []
    for _ in range(2):
        with pytest.raises(openai.BadRequestError) as refused:
            await gw.openai().chat.completions.create(model="m", messages=HI)
        params.append(refused.value.param)
        assert "sk-upstream-secret" not in refused.value.response.text

    assert params == ["messages[0].content[0].type", None]


async def test_upstream_param_reaches_a_responses_client_as_the_field_it_sent(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # The upstream names the chat request it was sent: a Responses client sent
    # ``max_output_tokens`` and ``input``, and its ``param`` was null.
    def refusal(param: str) -> Reply:
        error = {"message": "Invalid value.", "type": "invalid_request_error", "code": "x"}
        return Reply(400, body={"error": {**error, "param": param}})

    fake_upstream.enqueue(refusal("max_tokens"), refusal("messages[1].content"))
    fake_upstream.enqueue(refusal("bogus_field"))
    client = (await gateway_factory(config(model("m", route(fake_upstream))))).openai()
    turn = [{"role": "user", "content": "hi"}, {"role": "user", "content": "again"}]

    params = []
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="m", input="hi", max_output_tokens=9)
    params.append(refused.value.param)
    with pytest.raises(openai.BadRequestError) as refused:
        async with client.responses.stream(model="m", instructions="Be terse.", input=turn) as s:
            await s.until_done()
    params.append(refused.value.param)
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="m", input="hi")
    params.append(refused.value.param)

    # instructions became messages[0]: messages[1] is input[0].
    assert params == ["max_output_tokens", "input[0].content", "bogus_field"]
