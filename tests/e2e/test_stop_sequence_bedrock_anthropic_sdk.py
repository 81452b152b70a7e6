"""Claude on a ``bedrock`` route tells a Messages client which stop sequence ended its answer.

Converse's ``stopReason: stop_sequence`` does not say which sequence matched; Claude does, in
``additionalModelResponseFields.stop_sequence``, when the request asks for that field path
(``additionalModelResponseFieldPaths: ["/stop_sequence"]``, AWS's own example). The gateway
never asked, and answered ``stop_reason: end_turn`` with ``stop_sequence: null``: a client
that stops on a sequence (a delimiter, a tag) could not tell the model finished from a match.
Now it asks Claude whenever the request has stop sequences and the Messages answer says
``stop_sequence`` and the sequence, plain and streamed, as an ``anthropic`` route does.
Through the official ``anthropic`` SDK against the fake Bedrock (which checks each body
against botocore's service model), on the in-process bus.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import HI, ONE_BUS, config, model
from tests.e2e.test_bedrock_surfaces_sdk import bedrock_route
from tests.fixtures.upstream import Reply
from tests.fixtures.upstream_bedrock import FakeBedrock, event

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

MATCHED: dict[str, Any] = {"stopReason": "stop_sequence"}
MATCHED["additionalModelResponseFields"] = {"stop_sequence": "</answer>"}
USAGE = {"inputTokens": 5, "outputTokens": 2, "totalTokens": 7}
ANSWER = {"output": {"message": {"role": "assistant", "content": [{"text": "42"}]}}}
STREAM = b"".join(
    [
        event("messageStart", {"role": "assistant"}),
        event("contentBlockDelta", {"delta": {"text": "42"}, "contentBlockIndex": 0}),
        event("contentBlockStop", {"contentBlockIndex": 0}),
        event("messageStop", MATCHED),
        event("metadata", {"usage": USAGE, "metrics": {"latencyMs": 1}}),
    ]
)


async def test_claude_on_bedrock_says_which_stop_sequence_ended_the_answer(
    gateway_factory: GatewayFactory,
) -> None:
    bedrock = FakeBedrock("bedrock1")
    async with bedrock:
        gw = await gateway_factory(config(model("m", bedrock_route(bedrock))))
        client = gw.anthropic()
        bedrock.enqueue(
            Reply(body={**ANSWER, **MATCHED, "usage": USAGE}),
            Reply(body=STREAM, headers={"content-type": "application/vnd.amazon.eventstream"}),
        )
        ask: dict[str, Any] = {"max_tokens": 9, "messages": HI, "stop_sequences": ["</answer>"]}

        plain = await client.messages.create(model="m", **ask)
        async with client.messages.stream(model="m", **ask) as stream:
            streamed = await stream.get_final_message()

        asked = [r.json.get("additionalModelResponseFieldPaths") for r in bedrock.requests]
    assert asked == [["/stop_sequence"], ["/stop_sequence"]]
    assert (plain.stop_reason, plain.stop_sequence) == ("stop_sequence", "</answer>")
    assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", "</answer>")
