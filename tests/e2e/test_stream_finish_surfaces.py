"""A stream that ends without a finish reason is truncated, on every surface.

The upstream closes its stream cleanly (``[DONE]``, or ``message_stop``) but never says why
the answer ended: no ``finish_reason`` / ``stop_reason``. Such an answer may be cut short, so
the client sees the dialect's error form (never ``[DONE]``, ``end_turn`` or ``completed``)
and the attempt is observed as the endpoint's failure, like a stream cut mid-answer.
Each surface's official SDK, against both upstream kinds, on ``inproc://`` and on NATS.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from schemas import Observation, subjects
from tests.e2e._surface_clients import DRIVERS
from tests.e2e.conftest import anthropic_route, config, eid, model, route, watch
from tests.fixtures.upstream import Reply, UpstreamFactory

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

PARTIAL = "Half an ans"


def _data(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _event(obj: dict[str, Any]) -> str:
    return f"event: {obj['type']}\n{_data(obj)}"


def _chat_without_finish() -> str:
    """A chat stream whose chunks never carry a ``finish_reason``, then ``[DONE]``."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "x"}
    deltas = ({"role": "assistant", "content": ""}, {"content": PARTIAL})
    chunks = [
        {**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas
    ]
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    chunks.append({**base, "choices": [], "usage": usage})
    return "".join(_data(c) for c in chunks) + "data: [DONE]\n\n"


def _messages_without_stop_reason() -> str:
    """An Anthropic stream that reaches ``message_stop`` with no ``stop_reason`` given."""
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "x",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": PARTIAL},
        },
        {"type": "content_block_stop", "index": 0},
        {"type": "message_stop"},
    ]
    return "".join(_event(e) for e in events)


KINDS = {
    "openai_compat": (route, _chat_without_finish),
    "anthropic": (anthropic_route, _messages_without_stop_reason),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("surface", ["chat", "responses", "messages"])
async def test_stream_without_finish_reason_ends_in_the_surface_error_form_and_counts_as_failure(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    surface: str,
    kind: str,
) -> None:
    make_route, sse = KINDS[kind]
    up = await fake_upstreams("up1")
    up.set_default(Reply(body=sse(), headers={"content-type": "text/event-stream"}))
    gw = await gateway_factory(config(model("m", make_route(up))))

    async with watch(gw, subjects.OBSERVATION_ANY) as obs:
        got, error = await DRIVERS[surface](gw).cut()
        seen = await obs.next(Observation, lambda o: o.endpoint == eid("m", up))

    assert got == PARTIAL
    assert "without a finish reason" in error
    assert (seen.outcome, seen.error_kind, seen.stream) == ("failure", "truncated", True)
    assert len(up.requests) == 1
