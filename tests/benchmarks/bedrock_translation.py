"""What a ``bedrock`` route's own work costs per request: translation, signing, decoding.

    python -m tests.benchmarks.bedrock_translation [--requests 2000] [--deltas 20]

Single process, no network. Each row times one step per request over ``--requests``
requests and prints p50/p99 of the thread's CPU time in microseconds (what the request costs
the event loop, without the time other processes took the core):

* ``request``: canonical chat (system, user turn, one earlier tool call and its result, one
  tool) -> Converse body -> JSON bytes;
* ``sign``: botocore's SigV4 over that body (route key credentials);
* ``answer``: a Converse JSON answer -> canonical chat completion;
* ``stream``: a ConverseStream answer of ``--deltas`` text deltas (event-stream frames built
  by the fake Bedrock's encoder, fed in one read) -> botocore's ``EventStreamBuffer`` (both
  CRCs checked) -> canonical chunks;
* ``total plain`` and ``total stream``: request + sign + answer, request + sign + stream.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING, Any

import msgspec
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.eventstream import EventStreamBuffer

from gateway.adapters.bedrock import converse_url
from gateway.adapters.bedrock_stream import ConverseToChatStream
from gateway.adapters.bedrock_wire import from_converse_response, to_converse_request
from tests.fixtures.upstream import split_text
from tests.fixtures.upstream_bedrock import event

if TYPE_CHECKING:
    from collections.abc import Callable

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
TEXT = "The weather in Paris is sunny with a light breeze and about twenty degrees. " * 4
CHAT: dict[str, Any] = {
    "model": "m",
    "max_tokens": 256,
    "temperature": 0.5,
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
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_prev", "content": "sunny, 20 C"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather by city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ],
}
USAGE = {"inputTokens": 120, "outputTokens": 60, "totalTokens": 180}
ANSWER = _encode(
    {
        "output": {"message": {"role": "assistant", "content": [{"text": TEXT}]}},
        "stopReason": "end_turn",
        "usage": USAGE,
        "metrics": {"latencyMs": 300},
    }
)
URL = converse_url(
    "https://bedrock-runtime.us-east-1.amazonaws.com", "amazon.nova-lite-v1:0", stream=False
)
CREDENTIALS = Credentials("AKIDBENCHMARK", "benchmark-secret")


def _stream_body(deltas: int) -> bytes:
    frames = [event("messageStart", {"role": "assistant"})]
    frames += [
        event("contentBlockDelta", {"delta": {"text": piece}, "contentBlockIndex": 0})
        for piece in split_text(TEXT, deltas)
    ]
    frames += [
        event("contentBlockStop", {"contentBlockIndex": 0}),
        event("messageStop", {"stopReason": "end_turn"}),
        event("metadata", {"usage": USAGE, "metrics": {"latencyMs": 300}}),
    ]
    return b"".join(frames)


def _request() -> bytes:
    return _encode(to_converse_request(CHAT))


def _sign(body: bytes) -> None:
    req = AWSRequest(
        method="POST", url=URL, data=body, headers={"content-type": "application/json"}
    )
    SigV4Auth(CREDENTIALS, "bedrock", "us-east-1").add_auth(req)


def _answer() -> None:
    from_converse_response(_decode(ANSWER), model="m")


def _stream(body: bytes) -> None:
    buf = EventStreamBuffer()
    buf.add_data(body)
    translator = ConverseToChatStream("m", include_usage=True)
    for message in buf:
        translator.feed(message.headers[":event-type"], _decode(message.payload))
    assert translator.is_complete


def _plain() -> None:
    _sign(_request())
    _answer()


def _streamed(body: bytes) -> None:
    _sign(_request())
    _stream(body)


def _time(step: Callable[[], object], n: int) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        t0 = time.thread_time_ns()
        step()
        samples.append((time.thread_time_ns() - t0) / 1000)
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, len(samples) * 99 // 100)]


def main() -> None:
    """Print one row per step."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--deltas", type=int, default=20)
    args = parser.parse_args()
    body = _request()
    stream = _stream_body(args.deltas)
    steps: dict[str, Callable[[], object]] = {
        "request": _request,
        "sign": lambda: _sign(body),
        "answer": _answer,
        f"stream ({args.deltas} deltas)": lambda: _stream(stream),
        "total plain": _plain,
        "total stream": lambda: _streamed(stream),
    }
    for step in steps.values():  # warm-up
        _time(step, 50)
    print(f"{args.requests} requests per row; thread CPU time per request")
    print(f"{'step':22} {'p50 us':>8} {'p99 us':>8}")
    for name, step in steps.items():
        p50, p99 = _time(step, args.requests)
        print(f"{name:22} {p50:8.1f} {p99:8.1f}")


if __name__ == "__main__":
    main()
