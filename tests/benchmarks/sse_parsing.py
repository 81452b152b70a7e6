"""What parsing one streamed upstream answer's SSE costs (``SSEParser.feed``).

    python -m tests.benchmarks.sse_parsing [--repeat 7]

Feeds, in one process, realistic streams as the upstream client hands them over: an OpenAI
chat stream (200 chunks of ~150 bytes, then ``[DONE]``) in reads of 1-4 whole events, the
same bytes in reads cut at arbitrary offsets, the same framed with CRLF, and an Anthropic
Messages stream (``event:`` + ``data:`` lines, 200 deltas) in reads of 1-4 events. Prints the
best of ``--repeat`` runs in microseconds per stream; and, for scale, one 8 MiB event (a
huge tool-call arguments delta) arriving in 64 KiB reads.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import timeit

from gateway.adapters.sse import SSEParser

BASE = {"id": "chatcmpl-0123456789abcdef", "object": "chat.completion.chunk", "created": 1}


def _openai_events() -> list[bytes]:
    out = []
    for i in range(200):
        choice = {"index": 0, "delta": {"content": f"word{i} "}, "finish_reason": None}
        body = json.dumps({**BASE, "model": "gpt-4o-mini", "choices": [choice]})
        out.append(b"data: " + body.encode() + b"\n\n")
    return [*out, b"data: [DONE]\n\n"]


def _anthropic_events() -> list[bytes]:
    def ev(name: str, data: dict[str, object]) -> bytes:
        return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    message = {"id": "msg_01", "type": "message", "role": "assistant", "content": []}
    out = [ev("message_start", {"type": "message_start", "message": message})]
    out.append(ev("content_block_start", {"type": "content_block_start", "index": 0}))
    out.append(ev("ping", {"type": "ping"}))
    for i in range(200):
        delta = {"type": "text_delta", "text": f"word{i} "}
        out.append(
            ev("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        )
    out.append(ev("content_block_stop", {"type": "content_block_stop", "index": 0}))
    out.append(ev("message_delta", {"type": "message_delta", "usage": {"output_tokens": 200}}))
    return [*out, ev("message_stop", {"type": "message_stop"})]


def _grouped(events: list[bytes], rng: random.Random) -> list[bytes]:
    """The events joined into reads of 1-4 events each."""
    reads, i = [], 0
    while i < len(events):
        n = rng.randint(1, 4)
        reads.append(b"".join(events[i : i + n]))
        i += n
    return reads


def _cut(data: bytes, rng: random.Random) -> list[bytes]:
    """``data`` in reads of 100-700 bytes, cut anywhere."""
    reads, i = [], 0
    while i < len(data):
        n = rng.randint(100, 700)
        reads.append(data[i : i + n])
        i += n
    return reads


def _parse(reads: list[bytes]) -> int:
    feed = SSEParser().feed
    n = 0
    for read in reads:
        n += len(feed(read))
    return n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(5)
    openai = _openai_events()
    cases = {
        "openai chat, reads of 1-4 events": _grouped(openai, rng),
        "openai chat, reads cut anywhere": _cut(b"".join(openai), rng),
        "openai chat CRLF, reads of 1-4 events": _grouped(
            [e.replace(b"\n", b"\r\n") for e in openai], rng
        ),
        "anthropic messages, reads of 1-4 events": _grouped(_anthropic_events(), rng),
    }
    for name, reads in cases.items():
        number = 200
        best = min(
            timeit.repeat(functools.partial(_parse, reads), number=number, repeat=args.repeat)
        )
        size = sum(map(len, reads))
        print(f"{name:42} {len(reads):4} reads {size:6} B  {best / number * 1e6:8.1f} us/stream")
    big = b'data: {"arguments": "' + b"y" * (8 << 20) + b'"}\n\n'
    reads = [big[i : i + 65536] for i in range(0, len(big), 65536)]
    best = min(timeit.repeat(functools.partial(_parse, reads), number=1, repeat=3))
    print(
        f"{'one 8 MiB event, 64 KiB reads':42} {len(reads):4} reads          {best * 1e3:8.1f} ms"
    )


if __name__ == "__main__":
    main()
