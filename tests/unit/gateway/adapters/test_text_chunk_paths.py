"""The typed path of a stream chunk (``schemas.text_chunk``) held to the dict path on many
varied chunks: realistic ones (OpenAI, vLLM, DeepSeek, OpenRouter, Groq), each mutated at
random (a field added, removed, nulled or given another type; nested values; odd strings),
seeded so that a failure reproduces. Wherever the typed decode takes a chunk, the dict path
would have passed it (``chunk_problem`` for one choice and for two) and every reader sees
the same: its characters, first token, finish reason, its dict, and the frames each client
surface renders of it."""

from __future__ import annotations

import copy
import json
import os
import random
import time
from typing import Any

import msgspec
import pytest

from gateway.adapters.base import carries_token, chunk_problem
from gateway.formats import anthropic_messages, openai_responses
from gateway.formats.openai_chat import ChatStream, delta_chars
from schemas.text_chunk import text_chunk

CASES = 4000
SEED = 20261207

_HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000}
BASES: list[dict[str, Any]] = [
    {
        **_HEAD,
        "model": "gpt-4o",
        "service_tier": "default",
        "system_fingerprint": "fp_x",
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": "", "refusal": None},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        "usage": None,
        "obfuscation": "abc",
    },
    {**_HEAD, "model": "m", "choices": [{"index": 0, "delta": {"content": "Hello"}}]},
    {
        **_HEAD,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": {"reasoning_content": "hm", "content": None},
                "logprobs": None,
                "finish_reason": None,
                "stop_reason": None,
            }
        ],
    },
    {
        **_HEAD,
        "provider": "OpenAI",
        "model": "openai/gpt-4o",
        "choices": [
            {
                "index": 0,
                "delta": {"content": "Hi", "reasoning": None, "reasoning_details": []},
                "finish_reason": None,
                "native_finish_reason": None,
            }
        ],
    },
    {**_HEAD, "model": "m", "x_groq": {"id": "req_1"}, "choices": [{"delta": {"content": "z"}}]},
    {**_HEAD, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": 9}]},
    {**_HEAD, "choices": [{"index": 0, "delta": {"refusal": "no"}, "finish_reason": "length"}]},
    {**_HEAD, "choices": [], "usage": None},
]
KEYS = [
    *{k for base in BASES for k in base},
    *("index", "delta", "logprobs", "finish_reason", "stop_reason", "native_finish_reason"),
    *("role", "content", "refusal", "reasoning_content", "reasoning", "reasoning_details"),
    *("tool_calls", "function_call", "audio", "error", "_start_usage", "x", "text", "type"),
]
STRINGS = ["", "x", "stop", "assistant", "é", "\u2028", "😀", 'a"b', "\\", '"usage":{', "0"]


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10 if depth < 2 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, -1, 2, 2**70, 1700000000])
    if kind == 3:
        return rng.choice([0.0, 1.5, -0.0, 1e300])
    if kind in (4, 5, 6):
        return rng.choice(STRINGS)
    if kind == 7:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {rng.choice(KEYS): _value(rng, depth + 1) for _ in range(rng.randrange(3))}


def _places(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    """The objects of ``chunk`` a mutation may change: it, its choices, their deltas."""
    places = [chunk]
    choices = chunk.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if isinstance(choice, dict):
            places.append(choice)
            if isinstance(choice.get("delta"), dict):
                places.append(choice["delta"])
    return places


def _mutated(rng: random.Random) -> dict[str, Any]:
    chunk = copy.deepcopy(rng.choice(BASES))
    for _ in range(rng.randrange(4)):
        place = rng.choice(_places(chunk))
        action = rng.randrange(3)
        if action == 0 and place:
            del place[rng.choice(list(place))]
        elif action == 1 and place:
            place[rng.choice(list(place))] = _value(rng)
        else:
            place[rng.choice(KEYS)] = _value(rng)
    return chunk


def _frames(renderer: Any, chunk: Any) -> list[Any]:
    """What ``renderer`` makes of ``chunk`` and its end, each ``data:`` line as its JSON."""
    out = []
    for frame in [*renderer.feed(chunk), *renderer.finish()]:
        lines = frame.decode().split("\n")
        out.append([json.loads(line[6:]) if line[6:8] == '{"' else line for line in lines])
    return out


def _renderers() -> list[Any]:
    return [
        ChatStream("client-model", usage=True),
        ChatStream("client-model", usage=False),
        openai_responses.ChatToResponsesStream("client-model", request={"input": "hi"}),
        anthropic_messages.ChatToMessagesStream("client-model"),
    ]


@pytest.fixture
def fixed_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """The renderers' ids and times fixed, so that two renderings of a chunk compare."""
    monkeypatch.setattr(os, "urandom", lambda n: b"\0" * n)
    monkeypatch.setattr(time, "time", lambda: 1700000000.0)


def _choices(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in chunk.get("choices") or () if isinstance(c, dict)]  # typed: a list


@pytest.mark.usefixtures("fixed_ids")
def test_wherever_the_typed_path_takes_a_chunk_every_reader_sees_what_the_dict_path_gave() -> None:
    rng = random.Random(SEED)
    typed_cases = 0
    for case in range(CASES):
        event = _mutated(rng)
        raw = json.dumps(event, separators=(",", ":") if case % 2 else (", ", ": ")).encode()
        typed = text_chunk(raw)
        if typed is None:
            continue
        typed_cases += 1
        as_dict = msgspec.json.decode(raw)
        context = f"case {case}: {raw!r}"
        assert chunk_problem(copy.deepcopy(as_dict), 1) is None, context
        assert chunk_problem(copy.deepcopy(as_dict), 2) is None, context
        assert typed.as_json() == as_dict, context
        assert typed.carries_token() == carries_token(as_dict), context
        chars = sum(delta_chars(c.get("delta") or {}) for c in _choices(as_dict))
        assert typed.content_chars() == chars, context
        reasons = [c["finish_reason"] for c in _choices(as_dict) if c.get("finish_reason")]
        assert typed.finished() == (reasons[0] if reasons else None), context
        for by_dict, by_type in zip(_renderers(), _renderers(), strict=True):
            once = _frames(by_dict, copy.deepcopy(as_dict))
            assert _frames(by_type, text_chunk(raw)) == once, context
    # The mutations leave a good share of the chunks text, and refuse the rest.
    assert CASES // 5 < typed_cases < CASES


def _stream(rng: random.Random) -> list[bytes]:
    """A stream's chunk events: mutated chunks, some text (typed), some not."""
    return [
        json.dumps(_mutated(rng), separators=(",", ":")).encode()
        for _ in range(rng.randrange(1, 12))
    ]


def _chunks(events: list[bytes]) -> list[Any]:
    """Each event decoded as the adapter does: a TextChunk where it is one, else a dict."""
    return [text_chunk(raw) or msgspec.json.decode(raw) for raw in events]


def _rendered(render: Any, batches: list[list[Any]]) -> tuple[bytes, str | None]:
    """What ``render(batch, out)`` appends to ``out`` for ``batches``, and the error that
    ended it, if one did."""
    out = bytearray()
    try:
        for batch in batches:
            render(batch, out)
    except Exception as exc:
        return bytes(out), type(exc).__name__
    return bytes(out), None


def _one_by_one(feed: Any) -> Any:
    """A ``render(batch, out)`` that calls ``feed`` on the batch's one chunk."""

    def render(batch: list[Any], out: bytearray) -> None:
        for frame in feed(batch[0]):
            out += frame

    return render


@pytest.mark.usefixtures("fixed_ids")
def test_a_batch_fed_at_once_renders_what_its_chunks_fed_one_by_one_render() -> None:
    """The relay renders a batch with one ``feed_all`` (ChatStream encodes it into one
    buffer): the same bytes as each chunk's ``feed`` in turn, on every surface."""
    rng = random.Random(SEED + 1)
    for case in range(CASES // 8):
        events = _stream(rng)
        cuts = sorted(rng.sample(range(1, len(events) + 1), rng.randrange(1, len(events) + 1)))
        for one_by_one, at_once in zip(_renderers(), _renderers(), strict=True):
            singles = [[chunk] for chunk in _chunks(events)]
            chunks, start, batches = _chunks(events), 0, []
            for cut in cuts:
                batches.append(chunks[start:cut])
                start = cut
            batches.append(chunks[start:])  # the rest (none when the last cut is the end)
            expected, failed = _rendered(_one_by_one(one_by_one.feed), singles)
            got, got_failed = _rendered(at_once.feed_all, batches)
            # Up to a chunk that raises, too: the frames before it in its batch are kept.
            assert (got, got_failed) == (expected, failed), f"case {case}: {events!r}"
