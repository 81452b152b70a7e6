"""A translated request reaches an OpenAI reasoning model with the token limit it takes.

The Messages and Responses surfaces name their client's limit ``max_tokens`` on the chat
shape (Claude Code always sends one), and OpenAI's o-series and gpt-5 models refuse it:
"Unsupported parameter: 'max_tokens' is not supported with this model. Use
'max_completion_tokens' instead." Every such request failed on those routes. The
``openai_compat`` adapter now sends a refused request again with the limit so named, and
names it so from then on for that endpoint. Through the official anthropic and openai SDKs,
plain and streamed, against the scriptable fake upstream, on the in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.e2e.conftest import HI, ONE_BUS, config, model, route
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

REFUSAL = Reply(
    400,
    body={
        "error": {
            "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
            "Use 'max_completion_tokens' instead.",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "unsupported_parameter",
        }
    },
)


async def test_refused_max_tokens_is_sent_again_as_max_completion_tokens_and_then_so(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    plain_first, stream_first = await fake_upstreams("gpt5a"), await fake_upstreams("gpt5b")
    plain_first.enqueue(REFUSAL)
    stream_first.enqueue(REFUSAL)
    gw = await gateway_factory(
        config(model("a", route(plain_first)), model("b", route(stream_first)))
    )
    claude_code, codex = gw.anthropic(), gw.openai()

    answer = await claude_code.messages.create(model="a", max_tokens=50, messages=HI)
    async with claude_code.messages.stream(model="a", max_tokens=60, messages=HI) as stream:
        streamed = await stream.get_final_message()
    events = await codex.responses.create(model="b", input="hi", max_output_tokens=70, stream=True)
    kinds = [event.type async for event in events]
    later = await codex.responses.create(model="b", input="hi", max_output_tokens=80)

    assert answer.content and streamed.content and later.output_text
    assert kinds[-1] == "response.completed"
    for up, limits in ((plain_first, [50, 50, 60]), (stream_first, [70, 70, 80])):
        sent = [r.json for r in up.requests]
        assert [s.get("max_tokens") for s in sent] == [limits[0], None, None]
        assert [s.get("max_completion_tokens") for s in sent] == [None, *limits[1:]]
