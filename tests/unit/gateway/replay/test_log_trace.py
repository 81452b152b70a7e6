"""A trace read from the request log's JSON lines (``llmgw logs --json``): each request at the
size of the attempt that served it, as the client asked it, not the sum of its attempts' that
its request row shows (a hedged or failed-over request billed more than one)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from gateway.replay.trace import read_trace

if TYPE_CHECKING:
    from pathlib import Path

_REQUEST = {"requested_model": "m", "model": "m", "ts": 2.0, "latency_ms": 1000.0}


def test_a_logged_request_is_replayed_at_its_serving_attempts_size(tmp_path: Path) -> None:
    rows = [
        {**_REQUEST, "kind": "request", "request_id": "r1", "attempt": 2,
         "prompt_tokens": 17, "completion_tokens": 10},
        {"kind": "attempt", "request_id": "r1", "attempt": 1, "outcome": "cancelled",
         "prompt_tokens": 7, "completion_tokens": 5, "ts": 1.5},
        {"kind": "attempt", "request_id": "r1", "attempt": 2, "outcome": "success",
         "prompt_tokens": 10, "completion_tokens": 5, "ts": 2.0},
        {**_REQUEST, "kind": "request", "request_id": "r2", "attempt": 1,
         "prompt_tokens": 30, "completion_tokens": 3},  # no attempt rows: the request's
    ]  # fmt: skip
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))

    trace = read_trace(path)

    assert [(r.id, r.prompt_tokens, r.output_tokens) for r in trace] == [
        ("r1", 10, 5),
        ("r2", 30, 3),
    ]
