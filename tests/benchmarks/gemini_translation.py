"""What translating one request to the ``gemini`` kind and its answer back costs.

    python -m tests.benchmarks.gemini_translation [--requests 20000]

Times, in one process and on the thread's CPU clock, the ``gemini`` adapter's pure work for
a chat turn of the size the surface matrix sends (a system prompt, a user turn, an earlier
tool call and its result, one tool; the answer a text of about 60 tokens in 6 stream
chunks): canonical -> ``generateContent`` body (and its JSON encoding), the JSON answer
decoded -> canonical, and the streamed answer's chunks decoded -> canonical chunks. Prints
p50/p99 in microseconds per request for each, and the sum; no I/O is included, so it is
the translation's own share of a request against the gateway's ~450-700 µs of CPU.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import msgspec

from gateway.adapters.gemini_wire import (
    GeminiToChatStream,
    from_gemini_response,
    to_gemini_request,
)
from tests.fixtures.upstream import split_text

TEXT = "The weather in Paris is sunny with a light breeze and about twenty degrees. " * 4
REQUEST: dict[str, Any] = {
    "model": "m",
    "temperature": 0.5,
    "max_tokens": 256,
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_prev",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_prev", "content": "sunny"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather by city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ],
}
USAGE = {"promptTokenCount": 60, "candidatesTokenCount": 60, "cachedContentTokenCount": 20}


def _answer(parts: list[dict[str, Any]], finish: str | None) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        cand["finishReason"] = finish
    return {"candidates": [cand], "usageMetadata": USAGE, "modelVersion": "gemini-x"}


WHOLE = json.dumps(_answer([{"text": TEXT}], "STOP")).encode()
CHUNKS = [json.dumps(_answer([{"text": p}], None)).encode() for p in split_text(TEXT, 6)] + [
    json.dumps(_answer([{"text": ""}], "STOP")).encode()
]
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def _request() -> None:
    _encode(to_gemini_request(REQUEST))


def _response() -> None:
    from_gemini_response(_decode(WHOLE), model="m")


def _stream() -> None:
    translator = GeminiToChatStream("m", include_usage=True)
    for raw in CHUNKS:
        translator.feed(_decode(raw))
    assert translator.is_complete


def _time(fn: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.thread_time_ns()
        fn()
        out.append((time.thread_time_ns() - t) / 1000)
    out.sort()
    return out


def main() -> None:
    """Print p50/p99 µs per request for each translation step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    args = parser.parse_args()
    p50s: dict[str, float] = {}
    print(f"{'step':28} {'p50 us':>8} {'p99 us':>8}")
    for name, fn in (
        ("request canonical->gemini", _request),
        ("answer gemini->canonical", _response),
        ("stream 7 chunks->canonical", _stream),
    ):
        _time(fn, min(1000, args.requests))  # warm-up
        got = _time(fn, args.requests)
        p50, p99 = got[len(got) // 2], got[int(len(got) * 0.99)]
        p50s[name] = p50
        print(f"{name:28} {p50:8.1f} {p99:8.1f}")
    request, answer, stream = p50s.values()
    print(f"{'plain request (p50 sum)':28} {request + answer:8.1f}")
    print(f"{'streamed request (p50 sum)':28} {request + stream:8.1f}")


if __name__ == "__main__":
    main()
