"""A Responses or Messages request refused after its translation to chat (by an upstream's
own translation) is refused naming the field the client sent, not the canonical one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from gateway.adapters.anthropic_wire import to_messages_request
from gateway.adapters.bedrock_wire import to_converse_request
from gateway.adapters.gemini_wire import to_gemini_request
from gateway.formats import anthropic_messages, openai_responses
from gateway.formats.client_paths import in_client_terms
from schemas import InvalidRequestError

if TYPE_CHECKING:
    from collections.abc import Callable

JSON = dict[str, Any]
UPSTREAMS: dict[str, Callable[[JSON], JSON]] = {
    "anthropic": lambda chat: to_messages_request(chat, upstream_model="claude"),
    "bedrock": to_converse_request,
    "gemini": to_gemini_request,
}
CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{not json"}
ANSWER = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
HI = {"role": "user", "content": "hi"}


def refusal(surface: Any, body: JSON, upstream: str) -> InvalidRequestError:
    """What ``upstream``'s translation refuses of ``body``'s canonical form, in the client's
    terms (as the ingress answers it)."""
    with pytest.raises(InvalidRequestError) as refused:
        UPSTREAMS[upstream](surface.to_chat_request(body))
    in_client_terms(refused.value, surface.origins_of(body))
    refused.value.upstream = upstream  # type: ignore[attr-defined]
    return refused.value


def assert_names(err: InvalidRequestError, path: str) -> None:
    assert err.message.startswith(f"{path}: "), err.message
    if getattr(err, "upstream", "") == "gemini":
        assert err.param == path.partition("[")[0]  # gemini's param names the array alone
    else:
        assert err.param == path


@pytest.mark.parametrize("upstream", list(UPSTREAMS))
@pytest.mark.parametrize(
    ("items", "path"),
    [
        ([HI, CALL, ANSWER], "input[1].arguments"),
        # A call after the assistant's text joins its message: the item is still its own.
        ([HI, {"role": "assistant", "content": "let me see"}, CALL, ANSWER], "input[2].arguments"),
        ([HI, {**CALL, "call_id": "c0", "arguments": "{}"}, CALL, ANSWER], "input[2].arguments"),
    ],
    ids=["alone", "after-text", "second-call"],
)
def test_responses_tool_call_arguments_are_named_as_the_input_item(
    upstream: str, items: list[JSON], path: str
) -> None:
    body = {"model": "m", "instructions": "be brief", "input": items}

    # It named messages[2].tool_calls[0].function.arguments (or the like).
    assert_names(refusal(openai_responses, body, upstream), path)


@pytest.mark.parametrize("upstream", ["anthropic", "bedrock"])
def test_a_responses_image_url_is_named_as_the_input_part(upstream: str) -> None:
    image = {"type": "input_image", "image_url": "ftp://example.com/cat.png"}
    body = {
        "model": "m",
        "input": [HI, {"role": "user", "content": [{"type": "input_text", "text": "x"}, image]}],
    }

    assert_names(refusal(openai_responses, body, upstream), "input[1].content[1].image_url")


def tool_output(call_id: str, *parts: JSON) -> JSON:
    return {"type": "function_call_output", "call_id": call_id, "output": list(parts)}


BAD_IMAGE = {"type": "input_image", "image_url": "ftp://example.com/cat.png"}
GOOD_IMAGE = {"type": "input_image", "image_url": "https://example.com/cat.png"}
SEEN = {"type": "input_text", "text": "seen"}


@pytest.mark.parametrize(
    ("outputs", "path"),
    [
        # The image waits for the run of tool messages to end, then is a user message's part.
        ([tool_output("c1", SEEN, BAD_IMAGE)], "input[2].output[1].image_url"),
        (
            [tool_output("c1", GOOD_IMAGE), tool_output("c2", SEEN, BAD_IMAGE)],
            "input[4].output[1].image_url",
        ),
    ],
    ids=["one-output", "second-output"],
)
def test_a_responses_tool_outputs_image_is_named_where_it_sits(
    outputs: list[JSON], path: str
) -> None:
    calls = [{**CALL, "call_id": f"c{n}", "arguments": "{}"} for n in (1, 2)][: len(outputs)]
    body = {"model": "m", "input": [HI, *calls, *outputs]}

    # It named input[2].output[0].image_url.url: the first output, an index among images.
    assert_names(refusal(openai_responses, body, "anthropic"), path)


def test_a_messages_image_url_is_named_as_its_block_after_tool_results() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}
    image = {"type": "image", "source": {"type": "url", "url": "ftp://example.com/cat.png"}}
    body = {
        "model": "m",
        "max_tokens": 5,
        "system": "be brief",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "see"}, use]},
            # Chat splits this turn: a tool message, then a user message of the rest.
            {"role": "user", "content": [result, {"type": "text", "text": "and"}, image]},
        ],
    }

    # It named messages[4].content[1].image_url.url: the chat message and part.
    assert_names(refusal(anthropic_messages, body, "anthropic"), "messages[2].content[2].source")


def test_a_messages_image_inside_a_tool_result_is_named_where_it_sits() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    image = {"type": "image", "source": {"type": "url", "url": "ftp://example.com/cat.png"}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": [image]}
    body = {
        "model": "m",
        "max_tokens": 5,
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ],
    }

    assert_names(
        refusal(anthropic_messages, body, "anthropic"), "messages[2].content[0].content[0].source"
    )


def test_a_canonical_field_a_surface_renames_is_named_by_the_surfaces_name() -> None:
    err = InvalidRequestError("max_tokens: must be at most 8192", param="max_tokens")
    origins = openai_responses.origins_of({"model": "m", "input": "hi"})

    in_client_terms(err, origins)

    assert (err.param, err.message, str(err)) == (
        "max_output_tokens",
        "max_output_tokens: must be at most 8192",
        "max_output_tokens: must be at most 8192",
    )


def test_a_field_no_translation_renamed_is_left_as_it_is() -> None:
    err = InvalidRequestError("temperature: anthropic upstreams accept 0 to 1", param="temperature")

    in_client_terms(err, openai_responses.origins_of({"model": "m", "input": "hi"}))

    assert (err.param, err.message) == (
        "temperature",
        "temperature: anthropic upstreams accept 0 to 1",
    )


def test_a_path_is_matched_at_a_boundary_not_inside_a_longer_index() -> None:
    origins = {"messages[1]": "input[0]", "messages[12]": "input[9]"}
    err = InvalidRequestError("messages[12].content: bad", param="messages[12].content")

    in_client_terms(err, origins)

    # messages[12] is not under messages[1] (which would read input[0]2].content).
    assert (err.param, err.message) == ("input[9].content", "input[9].content: bad")
