"""An ``openai_compat`` stream's text chunks come out as ``TextChunk``s, checked by their type
in one decode; every other chunk (a tool call, the usage, a field the type does not name, a
second choice) comes out as the dict it always was, checked as before, and after the first
of those that is not a tool call or the usage the stream stays on dicts. Through the seam
``make_adapters`` hands out, as the ingress gets them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from gateway.adapters.base import UpstreamTarget, carries_token
from gateway.adapters.registry import make_adapters
from gateway.adapters.upstream_http import UpstreamHTTP
from gateway.formats.openai_chat import delta_chars
from schemas import UpstreamBadResponseError
from schemas.text_chunk import TextChunk, chunk_json, text_chunk
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from schemas.text_chunk import Chunk
    from tests.fixtures.upstream import FakeUpstream

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
HEAD = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "up"}
ROLE = {**HEAD, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
TEXT = {
    **HEAD,
    "system_fingerprint": None,
    "choices": [{"index": 0, "delta": {"content": "hé"}, "logprobs": None, "finish_reason": None}],
    "usage": None,
}
STOP = {**HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
USAGE = {**HEAD, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
CALL = {
    **HEAD,
    "choices": [
        {"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "t", "type": "function"}]}}
    ],
}


@pytest.fixture
async def http() -> AsyncIterator[UpstreamHTTP]:
    client = UpstreamHTTP()
    yield client
    await client.aclose()


def _target(upstream: FakeUpstream, kind: str = "openai_compat") -> UpstreamTarget:
    return UpstreamTarget(
        endpoint="e",
        kind=kind,
        base_url=upstream.openai_base_url,
        upstream_model="m",
        api_key="sk-secret",
        timeout=5,
        connect_timeout=1,
    )


def _sse(*events: Any) -> Reply:
    body = "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events)
    return Reply(body=body + "data: [DONE]\n\n", headers={"content-type": "text/event-stream"})


async def _chunks(
    http: UpstreamHTTP, upstream: FakeUpstream, body: dict[str, Any] = BODY, kind: str = ""
) -> list[Chunk]:
    adapter = make_adapters(http)[kind or "openai_compat"]
    target = _target(upstream, kind or "openai_compat")
    return [chunk async for batch in adapter.stream(target, body) for chunk in batch]


async def test_text_chunks_are_typed_and_the_usage_and_a_tool_call_are_dicts(
    http: UpstreamHTTP, fake_upstream: FakeUpstream
) -> None:
    fake_upstream.enqueue(_sse(ROLE, TEXT, CALL, TEXT, STOP, USAGE))

    chunks = await _chunks(http, fake_upstream)

    assert [type(c).__name__ for c in chunks] == [
        "TextChunk",
        "TextChunk",
        "dict",  # a tool call: numbered on a dict
        "TextChunk",  # not a reason to leave the typed path
        "TextChunk",
        "dict",  # the usage: sanitised on a dict
    ]
    assert [chunk_json(c) for c in chunks] == [ROLE, TEXT, CALL, TEXT, STOP, USAGE]


async def test_a_field_the_type_does_not_name_keeps_the_chunk_and_the_rest_dicts(
    http: UpstreamHTTP, fake_upstream: FakeUpstream
) -> None:
    vendor = {**TEXT, "x_vendor": {"queue": 2}}
    fake_upstream.enqueue(_sse(ROLE, vendor, TEXT, STOP))

    chunks = await _chunks(http, fake_upstream)

    assert [type(c) is TextChunk for c in chunks] == [True, False, False, False]
    assert chunks[1] == vendor  # relayed whole, the field a typed decode would drop included


@pytest.mark.parametrize(
    ("delta", "problem"),
    [
        ({"content": 5}, "'content' is not a string"),
        ({"role": ["assistant"]}, "'role' is not a string"),
        ({"reasoning_content": {"text": "x"}}, "'reasoning_content' is not a string"),
    ],
)
async def test_a_text_field_of_another_type_is_refused_as_before(
    http: UpstreamHTTP, fake_upstream: FakeUpstream, delta: dict[str, Any], problem: str
) -> None:
    fake_upstream.enqueue(_sse(ROLE, {**HEAD, "choices": [{"index": 0, "delta": delta}]}, STOP))

    with pytest.raises(UpstreamBadResponseError, match=problem):
        await _chunks(http, fake_upstream)


async def test_a_second_choice_is_a_dict_when_asked_for_and_refused_when_not(
    http: UpstreamHTTP, fake_upstream: FakeUpstream
) -> None:
    second = {**HEAD, "choices": [{"index": 1, "delta": {"content": "b"}}]}
    fake_upstream.enqueue(_sse(ROLE, second, STOP))
    chunks = await _chunks(http, fake_upstream, {**BODY, "n": 2})
    assert [type(c) is TextChunk for c in chunks] == [True, False, False]

    fake_upstream.enqueue(_sse(ROLE, second, STOP))
    with pytest.raises(UpstreamBadResponseError, match="'index' is not one of the 1"):
        await _chunks(http, fake_upstream)


async def test_azure_chunks_stay_dicts_and_its_filter_chunk_is_dropped(
    http: UpstreamHTTP, fake_upstream: FakeUpstream
) -> None:
    # Azure opens a stream with a chunk of no choices (the prompt's filter results): dropped,
    # which only the dict path says.
    fake_upstream.enqueue(_sse({**HEAD, "choices": []}, ROLE, TEXT, STOP))

    chunks = await _chunks(http, fake_upstream, kind="azure_openai")

    assert chunks == [ROLE, TEXT, STOP]


_EVENTS = [
    ROLE,
    TEXT,
    STOP,
    {"choices": [{"delta": {"reasoning_content": "think"}}]},
    {"choices": [{"index": 0, "delta": {"reasoning": "r", "refusal": None}}]},
    {"choices": [{"index": 0, "delta": {"refusal": "no"}, "stop_reason": None}]},
    {"choices": [{"index": 0, "delta": None, "finish_reason": "length"}], "obfuscation": "ab"},
    {"choices": [], "usage": None, "provider": "OpenAI", "service_tier": "flex"},
    {"choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": {"content": []}}]},
]


@pytest.mark.parametrize("event", _EVENTS)
def test_a_text_chunk_reads_as_its_dict_does(event: dict[str, Any]) -> None:
    typed = text_chunk(json.dumps(event).encode())
    assert typed is not None

    assert typed.as_json() == event
    assert json.loads(msgspec.json.encode(typed)) == event  # absent fields stay absent
    assert typed.carries_token() == carries_token(event)
    dict_chars = sum(delta_chars(c.get("delta") or {}) for c in event.get("choices") or ())
    assert typed.content_chars() == dict_chars
    reasons = [c["finish_reason"] for c in event.get("choices") or () if c.get("finish_reason")]
    assert typed.finished() == (reasons[0] if reasons else None)


@pytest.mark.parametrize(
    "event",
    [
        b'{"choices": [{"index": 0, "delta": {"content": [{"type": "text", "text": "a"}]}}]}',
        b'{"choices": [{"index": true, "delta": {"content": "a"}}]}',
        b'{"choices": [{"index": 0, "delta": {"audio": {"data": "AAA"}}}]}',
        b'{"choices": [{"index": 0, "delta": {"function_call": {"name": "f"}}}]}',
        b'{"choices": null}',
        b'{"id": 7, "choices": []}',
        b'{"choices": [], "usage": {"prompt_tokens": 1}}',
        b'{"error": {"message": "boom"}}',
        b'{"choices": [{"delta": {"content": "\\ud800"}}]}',
        b"[1]",
        b"{",
    ],
)
def test_what_is_not_a_text_chunk_is_left_to_the_dict_path(event: bytes) -> None:
    assert text_chunk(event) is None


def test_a_value_nested_to_the_recursion_limit_is_left_to_the_dict_path() -> None:
    # The typed decode goes a level or two deeper than the dict one: near the limit it may
    # fail where the dict path still reads the chunk, which must then get it (no error).
    for depth in range(900, 1100):
        event = b'{"provider":' + b"[" * depth + b"]" * depth + b',"choices":[]}'
        typed = text_chunk(event)
        if typed is not None:  # read as a dict by hand, not walked again
            assert typed.as_json()["choices"] == []
