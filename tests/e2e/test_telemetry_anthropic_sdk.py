"""OpenTelemetry through the real server process with the anthropic SDK: a Messages request
to an Anthropic upstream exports its SERVER span on ``/v1/messages`` and one GenAI CLIENT span
with Anthropic's cache tokens (reads, and writes under both spellings in use)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anthropic
import pytest

from tests.e2e.conftest import anthropic_route, config, eid, model
from tests.e2e.telemetry_support import (
    CANARIES,
    COMPLETION,
    GATEWAY_KEY,
    PROMPT,
    UPSTREAM_KEY,
    one,
    request_trace,
    start_traced,
)
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayProcess
    from tests.fixtures.otlp import OtlpReceiver
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = pytest.mark.e2e

MESSAGE = {
    "id": "msg_trace_1",
    "type": "message",
    "role": "assistant",
    "model": "b-model",
    "content": [{"type": "text", "text": COMPLETION}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 5,
        "cache_creation_input_tokens": 13,
        "cache_read_input_tokens": 3,
        "output_tokens": 4,
    },
}


async def test_telemetry_messages_request_exports_anthropic_client_span_with_cache_tokens(
    processes: list[GatewayProcess],
    tmp_path: Path,
    otlp_receiver: OtlpReceiver,
    fake_upstreams: UpstreamFactory,
) -> None:
    up = await fake_upstreams("b")
    up.set_default(Reply(body=MESSAGE))
    gw = await start_traced(
        processes,
        tmp_path,
        otlp_receiver,
        config(model("m", anthropic_route(up, api_key=UPSTREAM_KEY)), admin_key=GATEWAY_KEY),
    )
    async with anthropic.AsyncAnthropic(
        base_url=gw.url, api_key=GATEWAY_KEY, max_retries=0
    ) as client:
        raw = await client.messages.with_raw_response.create(
            model="m", max_tokens=64, messages=[{"role": "user", "content": PROMPT}]
        )
    answer = await raw.parse()
    assert answer.content[0].type == "text" and answer.content[0].text == COMPLETION
    assert float(raw.headers["x-llmgw-overhead-ms"]) >= 0.0

    spans = await request_trace(otlp_receiver, raw.headers["x-request-id"], 3)
    server, attempt = one(spans, "SERVER"), one(spans, "CLIENT")
    assert server.name == "POST /v1/messages"
    assert server.attributes["http.route"] == "/v1/messages"
    assert server.attributes["http.response.status_code"] == 200
    assert attempt.parent_id == server.span_id
    assert attempt.name == "chat b-model"
    a = attempt.attributes
    assert {
        k: a[k]
        for k in (
            "gen_ai.provider.name",
            "gen_ai.request.model",
            "gen_ai.response.model",
            "gen_ai.usage.output_tokens",
            "gen_ai.usage.cache_read.input_tokens",
            "gen_ai.usage.cache_creation.input_tokens",
            "gen_ai.usage.cache_write.input_tokens",
            "llmgw.model",
            "llmgw.endpoint",
        )
    } == {
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "b-model",
        "gen_ai.response.model": "b-model",
        "gen_ai.usage.output_tokens": 4,
        "gen_ai.usage.cache_read.input_tokens": 3,
        "gen_ai.usage.cache_creation.input_tokens": 13,
        "gen_ai.usage.cache_write.input_tokens": 13,
        "llmgw.model": "m",
        "llmgw.endpoint": eid("m", up),
    }
    assert a["gen_ai.usage.input_tokens"] >= 5
    assert a["gen_ai.response.finish_reasons"]
    assert up.requests[-1].headers["traceparent"].split("-")[1:3] == [
        attempt.trace_id,
        attempt.span_id,
    ]
    exported = b"".join(otlp_receiver.raw)
    for canary in CANARIES:
        assert canary.encode() not in exported, canary
