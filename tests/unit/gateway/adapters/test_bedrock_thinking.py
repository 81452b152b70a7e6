"""Claude's extended thinking on Bedrock: canonical chat <-> Converse at the wire seam.

Requests are checked against botocore's service model for ``bedrock-runtime`` (as the fake
Bedrock does); streams go on through the Messages surface to the anthropic SDK, which must
accumulate what the plain answer shows.
"""

from __future__ import annotations

import base64
import copy
from typing import TYPE_CHECKING, Any

import pytest
from botocore.loaders import Loader
from botocore.model import ServiceModel
from botocore.validate import ParamValidator

from gateway.adapters.anthropic_wire import DEFAULT_MAX_TOKENS
from gateway.adapters.base import UpstreamTarget
from gateway.adapters.bedrock_stream import ConverseToChatStream
from gateway.adapters.bedrock_wire import from_converse_response, to_converse_request
from gateway.adapters.registry import make_adapters, make_http_client
from gateway.formats import anthropic_messages
from schemas import InvalidRequestError
from schemas.bedrock_settings import BedrockSettings, is_claude
from tests.fixtures.anthropic_sdk import accumulated_message
from tests.fixtures.upstream_bedrock import BEDROCK_KEY, BEDROCK_REGION

if TYPE_CHECKING:
    from tests.fixtures.upstream_bedrock import FakeBedrock

JSON = dict[str, Any]
_SERVICE = ServiceModel(Loader().load_service_model("bedrock-runtime", "service-2"))
SIGNED = {"type": "thinking", "thinking": "Paris: call get_weather.", "signature": "EqQBsig"}
REDACTED = {"type": "redacted_thinking", "data": base64.b64encode(b"opaque").decode()}
CALL = {"id": "tooluse_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
APP_PROFILE = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6"


CLAUDE_CONTENT: list[JSON] = [
    {"reasoningContent": {"reasoningText": {"text": SIGNED["thinking"], "signature": "EqQBsig"}}},
    {"reasoningContent": {"redactedContent": REDACTED["data"]}},
    {"text": "Checking Paris."},
    {"reasoningContent": {"reasoningText": {"text": "Now the tool.", "signature": "sig-2"}}},
    {"toolUse": {"toolUseId": "tooluse_1", "name": "f", "input": {"city": "Paris"}}},
]


def _valid(req: JSON, operation: str = "Converse") -> JSON:
    """``req``, after botocore's validator found it a valid ``operation`` body."""
    params = copy.deepcopy(req)
    for message in params["messages"]:
        for block in message["content"]:
            if "redactedContent" in block.get("reasoningContent", {}):
                block["reasoningContent"]["redactedContent"] = base64.b64decode(
                    block["reasoningContent"]["redactedContent"], validate=True
                )
    params["modelId"] = "anthropic.claude-sonnet-4-5"
    report = ParamValidator().validate(params, _SERVICE.operation_model(operation).input_shape)
    assert not report.has_errors(), report.generate_report()
    return req


def _history(*assistant: JSON) -> JSON:
    return {
        "model": "m",
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            *assistant,
            {"role": "tool", "tool_call_id": "tooluse_1", "content": "sunny"},
        ],
    }


@pytest.mark.parametrize(
    ("model", "claude"),
    [
        ("anthropic.claude-sonnet-4-5-20250929-v1:0", True),
        ("us.anthropic.claude-3-7-sonnet-20250219-v1:0", True),
        ("arn:aws:bedrock:us-east-1:1:inference-profile/eu.anthropic.claude-opus-4-1", True),
        ("deepseek.r1-v1:0", False),
        ("amazon.nova-pro-v1:0", False),
    ],
)
def test_is_claude_knows_anthropic_model_ids(model: str, claude: bool) -> None:
    assert is_claude(model) is claude


def test_claude_request_sends_the_thinking_config_and_signed_blocks_first_in_the_turn() -> None:
    # Before: the config and the blocks were dropped, and Claude on Bedrock refuses a
    # tool-use turn without its thinking while thinking is on.
    assistant = {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]}
    chat = _history({**assistant, "thinking_blocks": [SIGNED, REDACTED]})

    req = _valid(to_converse_request(chat, claude=True))

    assert req["additionalModelRequestFields"] == {"thinking": chat["thinking"]}
    assert req["inferenceConfig"]["maxTokens"] == DEFAULT_MAX_TOKENS + 2048
    assert req["messages"][1]["content"] == [
        {
            "reasoningContent": {
                "reasoningText": {"text": SIGNED["thinking"], "signature": "EqQBsig"}
            }
        },
        {"reasoningContent": {"redactedContent": REDACTED["data"]}},
        {"text": "Checking."},
        {"toolUse": {"toolUseId": "tooluse_1", "name": "f", "input": {}}},
    ]


def test_claude_request_puts_interleaved_thinking_back_where_claude_gave_it() -> None:
    late = {**SIGNED, "after": 1}  # after the text, before the tool call
    assistant = {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]}

    req = _valid(
        to_converse_request(_history({**assistant, "thinking_blocks": [late]}), claude=True)
    )

    assert [next(iter(b)) for b in req["messages"][1]["content"]] == [
        "text",
        "reasoningContent",
        "toolUse",
    ]


def test_claude_request_puts_a_cache_point_after_its_marked_text_with_thinking() -> None:
    late = {**SIGNED, "after": 1}  # after the text, before the tool call
    marked = [{"type": "text", "text": "Checking.", "cache_control": {"type": "ephemeral"}}]
    assistant = {"role": "assistant", "content": marked, "tool_calls": [CALL]}

    req = _valid(
        to_converse_request(_history({**assistant, "thinking_blocks": [late]}), claude=True)
    )

    assert [next(iter(b)) for b in req["messages"][1]["content"]] == [
        "text",
        "cachePoint",
        "reasoningContent",
        "toolUse",
    ]


def test_claude_request_merging_two_assistant_messages_keeps_the_thinking_first() -> None:
    first = {"role": "assistant", "content": "Checking."}
    second = {
        "role": "assistant",
        "content": None,
        "tool_calls": [CALL],
        "thinking_blocks": [SIGNED],
    }

    req = _valid(to_converse_request(_history(first, second), claude=True))

    assert [next(iter(b)) for b in req["messages"][1]["content"]] == [
        "reasoningContent",
        "text",
        "toolUse",
    ]


def test_other_models_get_neither_the_config_nor_the_blocks() -> None:
    assistant = {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]}
    chat = _history({**assistant, "thinking_blocks": [SIGNED]}) | {"reasoning_effort": "high"}

    req = _valid(to_converse_request(chat, claude=False))

    assert "additionalModelRequestFields" not in req and "inferenceConfig" not in req
    assert [next(iter(b)) for b in req["messages"][1]["content"]] == ["text", "toolUse"]


@pytest.mark.parametrize(
    ("effort", "max_tokens", "thinking", "sent_max"),
    [
        ("low", None, {"type": "enabled", "budget_tokens": 1024}, DEFAULT_MAX_TOKENS + 1024),
        ("medium", 8000, {"type": "enabled", "budget_tokens": 2048}, 8000),
        ("none", 100, {"type": "disabled"}, 100),
    ],
)
def test_claude_request_thinks_as_hard_as_the_reasoning_effort_asks(
    effort: str, max_tokens: int | None, thinking: JSON, sent_max: int
) -> None:
    chat: JSON = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    chat |= {"reasoning_effort": effort, "max_tokens": max_tokens}

    req = _valid(to_converse_request(chat, claude=True))

    assert req["additionalModelRequestFields"] == {"thinking": thinking}
    assert req["inferenceConfig"]["maxTokens"] == sent_max


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"temperature": 0.3}, "temperature"),
        ({"top_p": 0.5}, "top_p"),
    ],
)
def test_claude_request_refuses_what_claude_refuses_while_thinking(extra: JSON, param: str) -> None:
    chat: JSON = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    chat["thinking"] = {"type": "enabled", "budget_tokens": 1024}

    with pytest.raises(InvalidRequestError) as caught:
        to_converse_request(chat, claude=True)

    assert caught.value.param == param


@pytest.mark.parametrize("extra", [{"max_tokens": 4096}, {"temperature": 0.3}, {"top_p": 0.5}])
def test_claude_request_sends_no_thinking_for_an_effort_claude_cannot_think_with(
    extra: JSON,
) -> None:
    chat: JSON = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    chat["reasoning_effort"] = "high"

    req = _valid(to_converse_request(chat, claude=True))

    assert "additionalModelRequestFields" not in req


# --- answers and streams --------------------------------------------------------------------

MESSAGES_CONTENT: list[JSON] = [
    SIGNED,
    REDACTED,
    {"type": "text", "text": "Checking Paris."},
    {"type": "thinking", "thinking": "Now the tool.", "signature": "sig-2"},
    {"type": "tool_use", "id": "tooluse_1", "name": "f", "input": {"city": "Paris"}},
]


def _answer(content: list[JSON]) -> JSON:
    message = {"role": "assistant", "content": content}
    usage = {"inputTokens": 3, "outputTokens": 9, "totalTokens": 12}
    return {"output": {"message": message}, "stopReason": "tool_use", "usage": usage}


def _events(content: list[JSON]) -> list[tuple[str, JSON]]:
    """ConverseStream's events for an answer holding ``content``, as Bedrock sends Claude's."""
    events: list[tuple[str, JSON]] = [("messageStart", {"role": "assistant"})]
    for i, block in enumerate(content):
        deltas: list[JSON] = []
        if "text" in block:
            deltas = [{"text": block["text"][:5]}, {"text": block["text"][5:]}]
        elif "toolUse" in block:
            use = block["toolUse"]
            start = {"toolUse": {"toolUseId": use["toolUseId"], "name": use["name"]}}
            events.append(("contentBlockStart", {"start": start, "contentBlockIndex": i}))
            deltas = [{"toolUse": {"input": '{"city": "Paris"}'}}]
        elif "reasoningText" in block["reasoningContent"]:
            said = block["reasoningContent"]["reasoningText"]
            deltas = [{"reasoningContent": {"text": said["text"][:4]}}]
            deltas += [{"reasoningContent": {"text": said["text"][4:]}}]
            if "signature" in said:
                deltas += [{"reasoningContent": {"signature": said["signature"]}}]
        else:
            deltas = [{"reasoningContent": block["reasoningContent"]}]
        events += [("contentBlockDelta", {"delta": d, "contentBlockIndex": i}) for d in deltas]
        events.append(("contentBlockStop", {"contentBlockIndex": i}))
    events.append(("messageStop", {"stopReason": "tool_use"}))
    events.append(("metadata", {"usage": {"inputTokens": 3, "outputTokens": 9, "totalTokens": 12}}))
    return events


def test_claude_answer_keeps_its_signed_and_redacted_blocks_in_order() -> None:
    # Before: the reasoning text only; no signature, so nothing a client could send back.
    chat = from_converse_response(_answer(CLAUDE_CONTENT), model="m")

    message = chat["choices"][0]["message"]
    plain = anthropic_messages.from_chat_response(chat, model="m")

    assert message["reasoning_content"] == SIGNED["thinking"] + "Now the tool."
    assert message["thinking_blocks"] == [
        SIGNED,
        REDACTED,
        {"type": "thinking", "thinking": "Now the tool.", "signature": "sig-2", "after": 1},
    ]
    assert plain["content"] == MESSAGES_CONTENT


def test_other_models_reasoning_stays_reasoning_text_only() -> None:
    content: list[JSON] = [{"reasoningContent": {"reasoningText": {"text": "hmm"}}}, {"text": "4"}]

    message = from_converse_response(_answer(content), model="m")["choices"][0]["message"]
    t = ConverseToChatStream("m", include_usage=False)
    chunks = [c for name, payload in _events(content) for c in t.feed(name, payload)]

    assert message["reasoning_content"] == "hmm" and "thinking_blocks" not in message
    assert not any("thinking_blocks" in c["choices"][0]["delta"] for c in chunks if c["choices"])


def test_claude_stream_accumulates_in_the_anthropic_sdk_to_the_plain_answer() -> None:
    upstream = ConverseToChatStream("m", include_usage=True)
    client_side = anthropic_messages.ChatToMessagesStream("m")
    frames: list[bytes] = []
    for name, payload in _events(CLAUDE_CONTENT):
        for chunk in upstream.feed(name, payload):
            frames += client_side.feed(chunk)
    frames += client_side.finish()
    streamed = accumulated_message(b"".join(frames))

    assert upstream.is_complete
    assert [b.model_dump(exclude_none=True) for b in streamed.content] == MESSAGES_CONTENT


@pytest.mark.parametrize(
    ("family", "thinking", "blocks"),
    [
        ("anthropic", {"thinking": {"type": "enabled", "budget_tokens": 2048}}, 2),
        (None, None, 0),
    ],
)
async def test_application_inference_profile_thinks_as_claude_when_its_route_says_anthropic(
    fake_bedrock: FakeBedrock, family: Any, thinking: JSON | None, blocks: int
) -> None:
    # Before: the ARN does not show Claude, so thinking and its signed blocks were dropped.
    settings = BedrockSettings(region=BEDROCK_REGION, model_family=family)
    target = UpstreamTarget(
        endpoint="m:bedrock",
        kind="bedrock",
        base_url=fake_bedrock.base_url,
        upstream_model=APP_PROFILE,
        api_key=BEDROCK_KEY,
        timeout=10.0,
        connect_timeout=5.0,
        bedrock=settings,
    )
    assistant = {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]}
    http = make_http_client()
    try:
        chat = _history({**assistant, "thinking_blocks": [SIGNED, REDACTED]})
        await make_adapters(http)["bedrock"].complete(target, chat)
    finally:
        await http.aclose()

    (sent,) = fake_bedrock.requests
    assert sent.model == APP_PROFILE
    assert sent.json.get("additionalModelRequestFields") == thinking
    kinds = [next(iter(b)) for b in sent.json["messages"][1]["content"]]
    assert kinds == ["reasoningContent"] * blocks + ["text", "toolUse"]
