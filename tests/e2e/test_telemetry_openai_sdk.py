"""OpenTelemetry through the real server process with the openai SDK: one SERVER span per
request, a routing span, one CLIENT span per upstream attempt in the GenAI conventions (plain,
streamed, a fallback hop, a hedge race), a client's ``traceparent`` continued, the attempt's
context sent upstream, and no secret or prompt text in any exported byte.

A real OTLP/HTTP receiver (tests/fixtures/otlp.py) decodes what the gateway exports; tests
wait for the spans' arrival, never sleep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import httpx
import openai
import pytest

from schemas.config import credential_id
from tests.e2e.conftest import WAIT, config, eid, model, route
from tests.e2e.keys_support import cli
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
from tests.fixtures.upstream import Hang, Reply

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayProcess
    from tests.fixtures.otlp import OtlpReceiver
    from tests.fixtures.upstream import FakeUpstream, UpstreamFactory

pytestmark = pytest.mark.e2e

ASK: list[Any] = [{"role": "user", "content": PROMPT}]
TINY = 1e-6


def _client(gw: GatewayProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key=GATEWAY_KEY, max_retries=0)


async def _one_route(
    processes: list[GatewayProcess],
    tmp_path: Path,
    otlp_receiver: OtlpReceiver,
    up: FakeUpstream,
) -> GatewayProcess:
    return await start_traced(
        processes,
        tmp_path,
        otlp_receiver,
        config(model("m", route(up, api_key=UPSTREAM_KEY)), admin_key=GATEWAY_KEY),
    )


async def _samples(http: httpx.AsyncClient) -> list[int]:
    """The RouteWise samples of model ``m``'s candidates, as ``/health/deep`` shows them."""
    deep = await http.get("/health/deep", headers={"authorization": f"Bearer {GATEWAY_KEY}"})
    return [c["samples"] for c in deep.json()["routewise"]["m"]["candidates"]]


async def _log_rows(gw: GatewayProcess, request_id: str, count: int) -> list[dict[str, Any]]:
    """The request log's rows of ``request_id`` once ``count`` are there (the summary is
    published as the request ends, just after the client has its answer)."""
    rows: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=gw.url) as http:
        with anyio.fail_after(WAIT):
            while len(rows) < count:
                answer = await http.post(
                    "/admin/log/query",
                    json={"request_id": request_id},
                    headers={"authorization": f"Bearer {GATEWAY_KEY}"},
                )
                rows = answer.json()["rows"]
    return rows


def _sent_context(headers: dict[str, str]) -> tuple[str, str]:
    """(trace id, parent span id) of a sampled W3C ``traceparent`` a request carried."""
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert version == "00" and int(flags, 16) & 1  # sampled
    return trace_id, span_id


def _assert_no_canary(receiver: OtlpReceiver) -> None:
    exported = b"".join(receiver.raw)
    assert exported  # something was exported, so the check below means something
    for canary in CANARIES:
        assert canary.encode() not in exported, canary


async def test_telemetry_plain_chat_exports_server_routing_and_one_genai_client_span(
    processes: list[GatewayProcess],
    tmp_path: Path,
    otlp_receiver: OtlpReceiver,
    fake_upstreams: UpstreamFactory,
) -> None:
    up = await fake_upstreams(
        "a", text=COMPLETION, prompt_tokens=11, completion_tokens=7, cached_tokens=3
    )
    gw = await _one_route(processes, tmp_path, otlp_receiver, up)
    async with _client(gw) as client:
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=ASK)
    assert raw.parse().choices[0].message.content == COMPLETION
    assert float(raw.headers["x-llmgw-overhead-ms"]) >= 0.0

    spans = await request_trace(otlp_receiver, raw.headers["x-request-id"], 3)
    server = one(spans, "SERVER")
    routing = one(spans, "INTERNAL", "llmgw.routing")
    attempt = one(spans, "CLIENT")
    port = int(gw.url.rsplit(":", 1)[-1])
    assert server.name == "POST /v1/chat/completions"
    assert server.parent_id == ""
    assert server.resource["service.name"] == "llmgw"
    assert {
        k: server.attributes[k]
        for k in ("http.request.method", "http.route", "http.response.status_code", "url.scheme")
    } == {
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "http.response.status_code": 200,
        "url.scheme": "http",
    }
    assert (server.attributes["server.address"], server.attributes["server.port"]) == (
        "127.0.0.1",
        port,
    )
    assert routing.parent_id == server.span_id
    assert routing.attributes["llmgw.routing.candidates"] == 1
    assert routing.attributes["llmgw.routing.primary"] == eid("m", up)
    assert routing.attributes["llmgw.routing.strategy"]
    assert attempt.parent_id == server.span_id
    assert attempt.name == "chat a-model"
    a = attempt.attributes
    assert {k: v for k, v in a.items() if k != "llmgw.cost_usd"} == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "a-model",
        "gen_ai.request.stream": False,
        "gen_ai.response.model": "a-model",
        "gen_ai.response.id": raw.parse().id,
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": 11,
        "gen_ai.usage.output_tokens": 7,
        "gen_ai.usage.cache_read.input_tokens": 3,
        "server.address": "127.0.0.1",
        "server.port": up.port,
        "http.response.status_code": 200,
        "llmgw.model": "m",
        "llmgw.endpoint": eid("m", up),
        "llmgw.credential_id": credential_id(UPSTREAM_KEY),
        "llmgw.attempt": 1,
        "llmgw.outcome": "success",
    }
    # The upstream request carried the attempt span's context.
    assert _sent_context(up.requests[-1].headers) == (attempt.trace_id, attempt.span_id)
    # The request log's rows (the request and its attempt) name the trace.
    rows = await _log_rows(gw, raw.headers["x-request-id"], 2)
    assert {(r["kind"], r["trace_id"]) for r in rows} == {
        ("request", server.trace_id),
        ("attempt", server.trace_id),
    }
    _assert_no_canary(otlp_receiver)


async def test_telemetry_stream_attempt_span_has_time_to_first_chunk_and_finish_reason(
    processes: list[GatewayProcess],
    tmp_path: Path,
    otlp_receiver: OtlpReceiver,
    fake_upstreams: UpstreamFactory,
) -> None:
    up = await fake_upstreams("a", text=COMPLETION, chunks=3)
    gw = await _one_route(processes, tmp_path, otlp_receiver, up)
    async with _client(gw) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=ASK, stream=True, stream_options={"include_usage": True}
        )
        text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
    assert text == COMPLETION
    assert float(raw.headers["x-llmgw-overhead-ms"]) >= 0.0

    spans = await request_trace(otlp_receiver, raw.headers["x-request-id"], 3)
    server, attempt = one(spans, "SERVER"), one(spans, "CLIENT")
    assert attempt.parent_id == server.span_id
    a = attempt.attributes
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert a["gen_ai.response.model"] == "a-model"
    assert a["gen_ai.response.time_to_first_chunk"] > 0.0
    assert a["gen_ai.usage.output_tokens"] == up.completion_tokens
    assert a["llmgw.outcome"] == "success"
    assert server.attributes["http.response.status_code"] == 200
    assert _sent_context(up.requests[-1].headers) == (attempt.trace_id, attempt.span_id)
    _assert_no_canary(otlp_receiver)


async def test_telemetry_fallback_hop_exports_one_client_span_per_attempt(
    processes: list[GatewayProcess],
    tmp_path: Path,
    otlp_receiver: OtlpReceiver,
    fake_upstreams: UpstreamFactory,
) -> None:
    first, second = await fake_upstreams("first"), await fake_upstreams("second")
    first.set_default(Reply(500))
    gw = await start_traced(
        processes,
        tmp_path,
        otlp_receiver,
        config(
            model("m", route(first, api_key=UPSTREAM_KEY), route(second, TINY)),
            routing={"bench": {"failures": 100}},
        ),
    )
    async with _client(gw) as client:
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=ASK)
    assert raw.headers["x-routed-via"] == eid("m", second)

    spans = await request_trace(otlp_receiver, raw.headers["x-request-id"], 4)
    server = one(spans, "SERVER")
    attempts = sorted(
        (s for s in spans if s.kind == "CLIENT"), key=lambda s: s.attributes["llmgw.attempt"]
    )
    assert [s.name for s in attempts] == ["chat first-model", "chat second-model"]
    assert all(s.parent_id == server.span_id for s in attempts)
    failed, served = (s.attributes for s in attempts)
    assert (failed["llmgw.outcome"], failed["http.response.status_code"]) == ("failure", 500)
    assert failed["error.type"] and attempts[0].status == 2  # STATUS_CODE_ERROR
    assert (served["llmgw.outcome"], served["llmgw.attempt"]) == ("success", 2)
    assert "error.type" not in served
    assert [_sent_context(r.headers) for r in (first.requests[-1], second.requests[-1])] == [
        (s.trace_id, s.span_id) for s in attempts
    ]
    assert server.attributes["http.response.status_code"] == 200


async def test_telemetry_limited_caller_gets_an_admission_span_admitted_then_refused(
    processes: list[GatewayProcess],
    tmp_path: Path,
    otlp_receiver: OtlpReceiver,
    fake_upstreams: UpstreamFactory,
) -> None:
    up = await fake_upstreams("a")
    made = await cli(tmp_path, "create", "--org", "acme", "--user", "alice", "--role", "pro")
    gw = await _one_route(processes, tmp_path, otlp_receiver, up)
    async with httpx.AsyncClient(base_url=gw.url) as http:
        limited = await http.put(
            f"/admin/limits/key/{made['id']}",
            json={"rpm": 1},
            headers={"authorization": f"Bearer {GATEWAY_KEY}"},
        )
        assert limited.status_code == 200, limited.text
        sent = [
            await http.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": ASK},
                headers={"authorization": f"Bearer {made['key']}"},
            )
            for _ in range(2)
        ]
    assert [r.status_code for r in sent] == [200, 429]

    admitted, refused = [
        await request_trace(otlp_receiver, r.headers["x-request-id"], n)
        for r, n in zip(sent, (4, 3), strict=True)
    ]
    server = one(admitted, "SERVER")
    admission = one(admitted, "INTERNAL", "llmgw.admission")
    assert admission.parent_id == server.span_id
    assert admission.attributes["llmgw.admission.outcome"] == "admitted"
    server = one(refused, "SERVER")
    admission = one(refused, "INTERNAL", "llmgw.admission")
    assert admission.parent_id == server.span_id
    assert admission.attributes["llmgw.admission.outcome"] == "rate_limited"
    assert admission.attributes["error.type"] == "rate_limited"
    assert (server.attributes["http.response.status_code"], server.attributes["error.type"]) == (
        429,
        "rate_limited",
    )
    assert not [s for s in refused if s.kind == "CLIENT"]  # nothing was sent upstream
    _assert_no_canary(otlp_receiver)
    exported = b"".join(otlp_receiver.raw)
    assert made["key"].encode() not in exported


async def test_telemetry_continues_the_clients_traceparent(
    processes: list[GatewayProcess],
    tmp_path: Path,
    otlp_receiver: OtlpReceiver,
    fake_upstreams: UpstreamFactory,
) -> None:
    up = await fake_upstreams("a")
    gw = await _one_route(processes, tmp_path, otlp_receiver, up)
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    async with _client(gw) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="m",
            messages=ASK,
            extra_headers={
                "traceparent": f"00-{trace_id}-{parent}-01",
                "tracestate": "vendor=opaque",
            },
        )

    spans = await request_trace(otlp_receiver, raw.headers["x-request-id"], 3)
    server, attempt = one(spans, "SERVER"), one(spans, "CLIENT")
    assert (server.trace_id, server.parent_id) == (trace_id, parent)
    assert attempt.trace_id == trace_id
    sent = up.requests[-1].headers
    assert _sent_context(sent) == (trace_id, attempt.span_id)
    assert sent["tracestate"] == "vendor=opaque"


async def test_telemetry_hedge_race_marks_primary_and_backup_spans(
    processes: list[GatewayProcess],
    tmp_path: Path,
    otlp_receiver: OtlpReceiver,
    fake_upstreams: UpstreamFactory,
) -> None:
    from tests.e2e.test_routewise_openai_sdk import CHEAP, DEAR, HEDGED

    slow, fast = await fake_upstreams("slow"), await fake_upstreams("fast")
    slow.set_default(Reply(delay=0.4))
    gw = await start_traced(
        processes,
        tmp_path,
        otlp_receiver,
        config(
            model(
                "m",
                route(slow, pricing=CHEAP),
                route(fast, pricing=DEAR),
                router="routewise",
                router_params={
                    "budget_alpha": 0.0,
                    "latency_slo_sec": 0.3,
                    "latency_hedge_mode": "probability_target",
                },
            ),
            routing={"affinity": {"enabled": False}},
            admin_key=GATEWAY_KEY,
        ),
    )
    async with _client(gw) as client, httpx.AsyncClient(base_url=gw.url) as http:
        # Profiles first (as tests/e2e/test_routewise_openai_sdk.py): the cheap primary misses
        # the SLO every time, so plans carry a hedge checkpoint.
        for up in (slow, fast):
            for _ in range(HEDGED):
                await client.chat.completions.create(
                    model="m", messages=ASK, extra_headers={"X-Route-Pin": eid("m", up)}
                )
        with anyio.fail_after(WAIT):
            while min(await _samples(http)) < HEDGED:
                pass
        slow.set_default(Hang())
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=ASK)
    assert raw.headers["x-routed-via"] == eid("m", fast)
    spans = await request_trace(otlp_receiver, raw.headers["x-request-id"], 4)
    server = one(spans, "SERVER")
    roles = {s.attributes["llmgw.hedge.role"]: s for s in spans if s.kind == "CLIENT"}
    assert set(roles) == {"primary", "backup"}
    primary, backup = roles["primary"].attributes, roles["backup"].attributes
    assert (primary["llmgw.endpoint"], primary["llmgw.hedge.outcome"]) == (
        eid("m", slow),
        "declined",
    )
    assert primary["error.type"] == "hedge_declined"
    assert (backup["llmgw.endpoint"], backup["llmgw.hedge.outcome"]) == (eid("m", fast), "won")
    assert all(s.parent_id == server.span_id for s in roles.values())
