"""OpenTelemetry convention choices through the real server process with the openai SDK:
``OTEL_SEMCONV_STABILITY_OPT_IN`` switches the HTTP and GenAI attribute names, and the
content-capture opt-in puts the prompt and completion on the CLIENT span (never without it:
see also the canary checks of test_telemetry_openai_sdk.py).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import openai
import pytest

from tests.e2e.conftest import config, model, route
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

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayProcess
    from tests.fixtures.otlp import OtlpReceiver
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = pytest.mark.e2e

SYSTEM = "system-canary-0d5e answer tersely"
ASK: list[Any] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
OLD_HTTP = ("http.method", "http.status_code", "http.target", "http.scheme", "net.host.name")


async def _traced(
    processes: list[GatewayProcess],
    tmp_path: Path,
    otlp_receiver: OtlpReceiver,
    fake_upstreams: UpstreamFactory,
    env: dict[str, str],
    telemetry: dict[str, Any] | None = None,
) -> openai.AsyncOpenAI:
    up = await fake_upstreams("a", text=COMPLETION, chunks=3)
    gw = await start_traced(
        processes,
        tmp_path,
        otlp_receiver,
        config(model("m", route(up, api_key=UPSTREAM_KEY)), admin_key=GATEWAY_KEY),
        telemetry=telemetry,
        env=env,
    )
    return openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=GATEWAY_KEY, max_retries=0)


async def test_telemetry_without_opt_in_uses_genai_v1_36_names_stable_http_and_no_content(
    processes: list[GatewayProcess],
    tmp_path: Path,
    otlp_receiver: OtlpReceiver,
    fake_upstreams: UpstreamFactory,
) -> None:
    async with await _traced(
        processes, tmp_path, otlp_receiver, fake_upstreams, {"OTEL_SEMCONV_STABILITY_OPT_IN": ""}
    ) as client:
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=ASK)
    spans = await request_trace(otlp_receiver, raw.headers["x-request-id"], 3)
    server, attempt = one(spans, "SERVER"), one(spans, "CLIENT")
    assert attempt.attributes["gen_ai.system"] == "openai"
    assert "gen_ai.provider.name" not in attempt.attributes
    assert server.attributes["http.request.method"] == "POST"
    assert not set(OLD_HTTP) & set(server.attributes)
    assert attempt.events == ()
    exported = b"".join(otlp_receiver.raw)
    for canary in (*CANARIES, SYSTEM):
        assert canary.encode() not in exported, canary


async def test_telemetry_opted_in_emits_old_and_new_http_names_and_latest_genai_content(
    processes: list[GatewayProcess],
    tmp_path: Path,
    otlp_receiver: OtlpReceiver,
    fake_upstreams: UpstreamFactory,
) -> None:
    env = {
        "OTEL_SEMCONV_STABILITY_OPT_IN": "http/dup, gen_ai_latest_experimental",
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
    }
    async with await _traced(processes, tmp_path, otlp_receiver, fake_upstreams, env) as client:
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=ASK)
        streamed = await client.chat.completions.with_raw_response.create(
            model="m", messages=ASK, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in streamed.parse()])
    assert text == COMPLETION

    spans = await request_trace(otlp_receiver, raw.headers["x-request-id"], 3)
    server, attempt = one(spans, "SERVER"), one(spans, "CLIENT")
    s = server.attributes
    assert (s["http.method"], s["http.request.method"]) == ("POST", "POST")
    assert (s["http.status_code"], s["http.response.status_code"]) == (200, 200)
    assert s["http.target"] == s["http.route"] == "/v1/chat/completions"
    assert s["net.host.name"] == s["server.address"]
    a = attempt.attributes
    assert a["gen_ai.provider.name"] == "openai"
    assert "gen_ai.system" not in a
    assert a["http.status_code"] == 200
    assert json.loads(a["gen_ai.system_instructions"]) == [{"type": "text", "content": SYSTEM}]
    user = [{"role": "user", "parts": [{"type": "text", "content": PROMPT}]}]
    answer = [
        {"role": "assistant", "parts": [{"type": "text", "content": COMPLETION}]}
        | {"finish_reason": "stop"}
    ]
    assert json.loads(a["gen_ai.input.messages"]) == user
    assert json.loads(a["gen_ai.output.messages"]) == answer

    stream_spans = await request_trace(otlp_receiver, streamed.headers["x-request-id"], 3)
    s_attempt = one(stream_spans, "CLIENT").attributes
    assert json.loads(s_attempt["gen_ai.input.messages"]) == user
    assert json.loads(s_attempt["gen_ai.output.messages"]) == answer


async def test_telemetry_capture_content_flag_without_latest_opt_in_emits_v1_36_events_cut(
    processes: list[GatewayProcess],
    tmp_path: Path,
    otlp_receiver: OtlpReceiver,
    fake_upstreams: UpstreamFactory,
) -> None:
    async with await _traced(
        processes,
        tmp_path,
        otlp_receiver,
        fake_upstreams,
        {"OTEL_SEMCONV_STABILITY_OPT_IN": ""},
        telemetry={"capture_content": True, "capture_max_chars": 256},
    ) as client:
        long = PROMPT + " " + "x" * 2000
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": long}]
        )
    spans = await request_trace(otlp_receiver, raw.headers["x-request-id"], 3)
    attempt = one(spans, "CLIENT")
    assert "gen_ai.input.messages" not in attempt.attributes
    events = dict(attempt.events)
    assert list(events) == ["gen_ai.user.message", "gen_ai.choice"]
    (user,) = json.loads(events["gen_ai.user.message"]["content"])
    assert user["content"].startswith(PROMPT)
    assert len(events["gen_ai.user.message"]["content"]) <= 256
    assert json.loads(events["gen_ai.choice"]["content"]) == [
        {"type": "text", "content": COMPLETION}
    ]
    assert events["gen_ai.choice"]["finish_reason"] == "stop"
