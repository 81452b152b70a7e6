"""What turning one read of an ``openai_compat`` stream into canonical chunks costs.

    python -m tests.benchmarks.chunk_batches [--repeat 5] [--chunks 50]

Single process, no network: the ``openai_compat`` adapter's per-read step (``_batch``: the SSE
split, each chunk's typed or dict decode, the tool-call numbering) over one read holding a
whole stream, for a stream of text deltas and one of a tool call's argument fragments (each
with a role chunk, a finish chunk and a usage chunk). Prints the best of ``--repeat`` runs in
microseconds per read. The two streams take different paths (text chunks are decoded as
typed structs, a tool call's as dicts), so a change that speeds one may slow the other.
"""

from __future__ import annotations

import argparse
import json
import timeit
from typing import Any

from gateway.adapters.base import UpstreamTarget
from gateway.adapters.openai_compat import OpenAICompatAdapter, _ChatStream

JSON = dict[str, Any]

_TARGET = UpstreamTarget(
    endpoint="e",
    kind="openai_compat",
    base_url="http://127.0.0.1:1",
    upstream_model="m",
    api_key="k",
    timeout=5,
    connect_timeout=1,
)
_USAGE: JSON = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "m",
    "choices": [],
    "usage": {"prompt_tokens": 10, "completion_tokens": 50, "total_tokens": 60},
}


def _chunk(delta: JSON, reason: str | None = None) -> JSON:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [choice],
    }


def text_stream(n: int) -> list[JSON]:
    """A role chunk, ``n`` content deltas, the finish and the usage chunk."""
    deltas = [_chunk({"content": f" word{i}"}) for i in range(n)]
    role = _chunk({"role": "assistant", "content": ""})
    return [role, *deltas, _chunk({}, "stop"), _USAGE]


def tool_stream(n: int) -> list[JSON]:
    """A role chunk, a tool call's head and ``n`` fragments of its arguments, the finish and
    the usage chunk."""
    head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f"}}
    parts = [
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": f'{{"a{i}":'}}]})
        for i in range(n)
    ]
    role = _chunk({"role": "assistant", "content": None})
    return [role, _chunk({"tool_calls": [head]}), *parts, _chunk({}, "tool_calls"), _USAGE]


def sse(chunks: list[JSON]) -> bytes:
    """``chunks`` as one read of SSE frames, ``[DONE]`` last."""
    frames = [f"data: {json.dumps(c, separators=(',', ':'))}\n\n" for c in chunks]
    return "".join(frames).encode() + b"data: [DONE]\n\n"


def read_cost(raw: bytes, repeat: int, number: int = 2000) -> float:
    """Best of ``repeat`` runs: microseconds for one stream's ``_batch`` of ``raw``."""
    adapter = OpenAICompatAdapter(None)  # type: ignore[arg-type]  # no HTTP: _batch only

    def one() -> None:
        if _ChatStream(adapter, _TARGET, {})._batch(raw) is None:
            raise AssertionError("the read completed no chunk")

    return min(timeit.repeat(one, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    """Print the cost of one read of each stream."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=50, help="deltas or fragments a stream")
    args = parser.parse_args()
    for name, chunks in (
        ("text deltas", text_stream(args.chunks)),
        ("tool call fragments", tool_stream(args.chunks)),
    ):
        cost = read_cost(sse(chunks), args.repeat)
        print(f"{name:20} {len(chunks):4} chunks  {cost:8.1f} µs a read")


if __name__ == "__main__":
    main()
