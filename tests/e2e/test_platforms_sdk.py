"""Azure OpenAI and Gemini routes end to end: the real server, the official openai and
anthropic SDKs on every surface, fake upstreams speaking each platform's wire.

Per kind and surface: a chat, a stream and a tool call keep their text, stop reasons, usage
(cached tokens included) and tool calls, and the upstream receives its own dialect (Azure's
deployment URL, api-version and ``api-key``; Gemini's ``systemInstruction``,
``functionDeclarations``, ``functionCall``/``functionResponse`` and ``x-goog-api-key``); a
failing route fails over to a route of the new kind. A throttled answer is a rate limit with
the platform's retry-after that cools the key, never the circuit or a bench, and a quota
exhaustion mutes it; a content-filter refusal reaches the client in its own API's
shape, is never failed over and never counts against the route. Each platform kind (bedrock
too) is priced from its usage, cache reads included.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest

from schemas import (
    BenchChanged,
    CircuitTransition,
    KeyCooling,
    KeyMuted,
    Observation,
    subjects,
)
from schemas.config import credential_id
from tests.e2e._surface_clients import (
    DRIVERS,
    MAX_TOKENS,
    PREV_ARGS,
    PREV_RESULT,
    QUESTION,
    SYSTEM,
    TEMPERATURE,
    TOOL_NAME,
    TOOL_SCHEMA,
    Answer,
    refused,
)
from tests.e2e.conftest import HI, ONE_BUS, config, eid, endpoint_states, model, route, watch
from tests.e2e.keys_support import admin_http, keys_config
from tests.fixtures.upstream import (
    FakeUpstream,
    Recorded,
    Reply,
    ToolCall,
    UpstreamFactory,
    azure_content_filter_error,
    google_error_body,
)
from tests.fixtures.upstream_bedrock import BEDROCK_KEY, BEDROCK_REGION, FakeBedrock

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = [pytest.mark.e2e, ONE_BUS]

SURFACES = ("chat", "responses", "messages")
KINDS = ("azure_openai", "gemini")
KEY = "platform-route-secret"
ADMIN = "admin-platforms-key"
DEPLOYMENT = "prod-deployment"
API_VERSION = "2024-10-21"
NEW_ARGS = '{"city":"Paris","unit":"c"}'
USAGE = (10, 5, 4)  # what the fake reports: 10 prompt tokens of which 4 cached, 5 completion
TINY = 1e-6


def platform_route(kind: str, up: FakeUpstream, **extra: Any) -> dict[str, Any]:
    """A route of ``kind`` to fake upstream ``up``."""
    if kind == "azure_openai":
        azure = {"deployment": DEPLOYMENT, "api_version": API_VERSION}
        return {
            "kind": kind,
            "base_url": up.azure_base_url,
            "provider_model_id": f"{up.name}-model",
            "api_key": KEY,
            "azure": azure,
            **extra,
        }
    return {
        "kind": kind,
        "base_url": up.gemini_base_url,
        "provider_model_id": f"{up.name}-model",
        "api_key": KEY,
        **extra,
    }


def _assert_upstream_saw(rec: Recorded, kind: str, *, tools: bool, stream: bool) -> None:
    body = rec.json
    if kind == "azure_openai":
        assert rec.path == f"/openai/deployments/{DEPLOYMENT}/chat/completions"
        assert rec.query == f"api-version={API_VERSION}"
        assert rec.headers["api-key"] == KEY and "authorization" not in rec.headers
        assert body["messages"][:2] == [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": QUESTION},
        ]
        assert bool(body.get("stream")) is stream
        if tools:
            assert body["tools"][0]["function"]["parameters"] == TOOL_SCHEMA
        return
    method = "streamGenerateContent" if stream else "generateContent"
    assert rec.path == f"/v1beta/models/up1-model:{method}"
    assert ("alt=sse" in rec.query) is stream
    assert rec.headers["x-goog-api-key"] == KEY and "authorization" not in rec.headers
    assert body["systemInstruction"] == {"parts": [{"text": SYSTEM}]}
    assert body["contents"][0] == {"role": "user", "parts": [{"text": QUESTION}]}
    assert body["generationConfig"] == {"maxOutputTokens": MAX_TOKENS, "temperature": TEMPERATURE}
    if tools:
        call, result = body["contents"][1:]
        assert call == {
            "role": "model",
            "parts": [{"functionCall": {"name": TOOL_NAME, "args": PREV_ARGS}}],
        }
        response = {"name": TOOL_NAME, "response": {"result": PREV_RESULT}}
        assert result == {"role": "user", "parts": [{"functionResponse": response}]}
        (declared,) = body["tools"][0]["functionDeclarations"]
        assert (declared["name"], declared["parametersJsonSchema"]) == (TOOL_NAME, TOOL_SCHEMA)


async def _serve(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, kind: str
) -> tuple[RunningGateway, FakeUpstream]:
    up = await fake_upstreams("up1", cached_tokens=USAGE[2], chunks=4)
    gw = await gateway_factory(config(model("m", platform_route(kind, up))))
    return gw, up


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("surface", SURFACES)
async def test_chat_stream_and_tool_call_reach_the_platform_route_in_its_own_wire(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, surface: str, kind: str
) -> None:
    gw, up = await _serve(gateway_factory, fake_upstreams, kind)
    driver = DRIVERS[surface](gw)

    plain = await driver.plain()
    streamed = await driver.stream()
    up.set_default(ToolCall(TOOL_NAME, NEW_ARGS, call_id="call_new1"))
    called = await driver.plain(tools=True)
    called_streamed = await driver.stream(tools=True)

    assert plain == Answer(up.text, driver.stops[0], USAGE, routed_via=eid("m", up))
    assert "".join(streamed.deltas) == up.text and len(streamed.deltas) > 1
    assert (streamed.text, streamed.stop, streamed.usage) == (up.text, driver.stops[0], USAGE)
    for got in (called, called_streamed):
        ((call_id, name, args),) = got.calls
        assert (name, json.loads(args)) == (TOOL_NAME, json.loads(NEW_ARGS)) and call_id
        assert (got.stop, got.usage, got.routed_via) == (driver.stops[1], USAGE, eid("m", up))
    plain_rec, stream_rec, tool_rec, tool_stream_rec = up.requests
    _assert_upstream_saw(plain_rec, kind, tools=False, stream=False)
    _assert_upstream_saw(stream_rec, kind, tools=False, stream=True)
    _assert_upstream_saw(tool_rec, kind, tools=True, stream=False)
    _assert_upstream_saw(tool_stream_rec, kind, tools=True, stream=True)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("surface", SURFACES)
async def test_failing_route_fails_over_to_the_platform_route(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, surface: str, kind: str
) -> None:
    broken = await fake_upstreams("broken", default=Reply(500))
    up = await fake_upstreams("up1")
    gw = await gateway_factory(
        config(model("m", route(broken), platform_route(kind, up, weight=TINY)))
    )
    driver = DRIVERS[surface](gw)

    plain = await driver.plain()
    streamed = await driver.stream()

    assert (plain.text, plain.routed_via) == (up.text, eid("m", up))
    assert (streamed.text, streamed.routed_via) == (up.text, eid("m", up))
    assert len(broken.requests) == 2 and len(up.requests) == 2


_THROTTLED = {
    "azure_openai": Reply(429, headers={"retry-after-ms": "7000"}),
    "gemini": Reply(
        429,
        body=google_error_body(
            429,
            "You exceeded your current quota, please check your plan and billing details.",
            [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}],
        ),
    ),
}


@pytest.mark.parametrize("kind", KINDS)
async def test_throttled_answer_cools_the_key_for_its_retry_after_never_the_circuit_or_bench(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, kind: str
) -> None:
    up = await fake_upstreams("up1")
    spare = await fake_upstreams("spare")
    up.enqueue(_THROTTLED[kind], Reply(500))
    keys = {"api_key": None, "api_keys": [KEY, KEY + "-2"]}
    gw = await gateway_factory(
        config(model("m", platform_route(kind, up, **keys), route(spare, weight=TINY)))
    )
    endpoint = eid("m", up)

    async with (
        watch(gw, subjects.observation(endpoint)) as obs,
        watch(gw, subjects.event("keypool")) as key_events,
        watch(gw, subjects.event("bench")) as benches,
        watch(gw, subjects.event("circuit")) as circuits,
        endpoint_states(gw, endpoint) as states,
    ):
        done = await gw.openai().chat.completions.create(model="m", messages=HI)
        throttled = await obs.next(Observation)
        cooled = await key_events.next(KeyCooling, lambda e: e.pool == endpoint)
        # A barrier: the other key is free, so the route still serves, and fails for real;
        # observations of one endpoint are handled in order, so this state includes the 429.
        await gw.openai().chat.completions.create(model="m", messages=HI)
        state = await states.state(lambda s: s.consecutive_failures > 0)

    assert done.choices[0].message.content == spare.text  # passed over, not waited for
    assert (throttled.status, throttled.retry_after, throttled.error_kind) == (429, 7.0, "http_429")
    assert cooled.hinted and cooled.seconds == pytest.approx(7.0, abs=0.5)
    assert (state.circuit_state, state.consecutive_failures) == ("closed", 1)  # the 500 only
    assert not [e for e in circuits.seen if isinstance(e, CircuitTransition)]
    assert not [e for e in benches.seen if isinstance(e, BenchChanged)]
    assert not [e for e in key_events.seen if isinstance(e, KeyMuted)]
    assert [r.credential for r in up.requests] == [KEY, KEY + "-2"]


_QUOTA_SPENT = {
    "azure_openai": Reply(
        429, body={"error": {"code": "insufficient_quota", "message": "You exceeded your quota."}}
    ),
    "gemini": Reply(
        429,
        body=google_error_body(
            429,
            "You exceeded your current quota, please check your plan and billing details.",
            [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel"}],
                }
            ],
        ),
    ),
}


@pytest.mark.parametrize("kind", KINDS)
async def test_quota_exhaustion_mutes_the_key(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, kind: str
) -> None:
    up = await fake_upstreams("up1")
    spare = await fake_upstreams("spare")
    up.enqueue(_QUOTA_SPENT[kind])
    keys = {"api_key": None, "api_keys": [KEY, KEY + "-2"]}  # a caller's only key is spared once
    gw = await gateway_factory(
        config(model("m", platform_route(kind, up, **keys), route(spare, weight=TINY)))
    )

    async with watch(gw, subjects.event("keypool")) as key_events:
        done = await gw.openai().chat.completions.create(model="m", messages=HI)
        muted = await key_events.next(KeyMuted, lambda e: e.pool == eid("m", up))

    assert done.choices[0].message.content == up.text  # the same route, on its other key
    assert up.requests[-1].credential == KEY + "-2" and not spare.requests
    assert muted.credential_id == credential_id(KEY)
    assert not [e for e in key_events.seen if isinstance(e, KeyCooling)]


async def test_azure_content_filter_refusal_reaches_each_surface_and_is_never_failed_over(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    up = await fake_upstreams("up1")
    spare = await fake_upstreams("spare")
    gw = await gateway_factory(
        config(model("m", platform_route("azure_openai", up), route(spare, weight=TINY)))
    )
    endpoint = eid("m", up)
    up.set_default(Reply(400, body=azure_content_filter_error()))

    async with watch(gw, subjects.observation(endpoint)) as obs:
        with pytest.raises(openai.BadRequestError) as chat_err:
            await gw.openai().chat.completions.create(model="m", messages=HI)
        with pytest.raises(openai.BadRequestError) as responses_err:
            await gw.openai().responses.create(model="m", input="hi")
        with pytest.raises(anthropic.BadRequestError) as messages_err:
            await gw.anthropic().messages.create(model="m", max_tokens=9, messages=HI)
        seen = [await obs.next(Observation) for _ in range(3)]

    assert chat_err.value.code == "content_filter"
    assert "content management policy" in chat_err.value.message
    assert responses_err.value.code == "content_filter"
    assert messages_err.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "content management policy" in messages_err.value.message
    assert not spare.requests  # the prompt is the caller's: no other route gets it
    assert [(o.outcome, o.status) for o in seen] == [("client_error", 400)] * 3
    up.set_default(Reply())
    served = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)
    assert served.headers["x-routed-via"] == endpoint  # its circuit never opened


@pytest.mark.parametrize("surface", SURFACES)
async def test_azure_content_filter_refusal_of_a_stream_reaches_the_client_as_its_400(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, surface: str
) -> None:
    up = await fake_upstreams("up1")
    spare = await fake_upstreams("spare")
    gw = await gateway_factory(
        config(model("m", platform_route("azure_openai", up), route(spare, weight=TINY)))
    )
    endpoint = eid("m", up)
    up.set_default(Reply(400, body=azure_content_filter_error()))
    driver = DRIVERS[surface](gw)

    async with watch(gw, subjects.observation(endpoint)) as obs:
        with pytest.raises(driver.bad_request) as err:
            await driver.stream()
        seen = await obs.next(Observation)

    refusal = err.value
    assert isinstance(refusal, openai.BadRequestError | anthropic.BadRequestError)
    assert "content management policy" in refusal.message
    if isinstance(refusal, openai.BadRequestError):  # chat, responses
        assert refusal.code == "content_filter"
    assert up.requests[0].json["stream"] is True
    assert not spare.requests  # the prompt is the caller's: no other route gets it
    assert (seen.outcome, seen.status) == ("client_error", 400)


_BLOCKED = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 3}}
_BLOCKED_TEXT = "the upstream's safety filter blocked the prompt (SAFETY)"


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
@pytest.mark.parametrize("surface", SURFACES)
async def test_gemini_blocked_prompt_reaches_each_surface_as_its_refusal_never_failed_over(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, surface: str, stream: bool
) -> None:
    up = await fake_upstreams("up1")
    spare = await fake_upstreams("spare")
    gw = await gateway_factory(
        config(model("m", platform_route("gemini", up), route(spare, weight=TINY)))
    )
    if stream:  # one event: the prompt's feedback, no candidate
        sse = f"data: {json.dumps(_BLOCKED)}\n\n"
        up.set_default(Reply(200, body=sse, headers={"content-type": "text/event-stream"}))
    else:
        up.set_default(Reply(200, body=_BLOCKED))

    async with watch(gw, subjects.observation(eid("m", up))) as obs:
        raw = await refused(gw, surface, stream)
        seen = await obs.next(Observation)

    assert (
        raw
        == {
            "chat": ("content_filter", _BLOCKED_TEXT),
            "responses": ("incomplete", "content_filter"),
            "messages": ("refusal", _BLOCKED_TEXT),
        }[surface]
    )
    assert up.requests[0].stream is stream
    assert (seen.outcome, seen.status) == ("success", 200)  # never against the route
    assert not spare.requests


@pytest.mark.parametrize(
    ("kind", "finish"), [("azure_openai", "content_filter"), ("gemini", "SAFETY")]
)
async def test_filtered_completion_reaches_chat_as_content_filter_and_messages_as_refusal(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, kind: str, finish: str
) -> None:
    up = await fake_upstreams("up1")
    gw = await gateway_factory(config(model("m", platform_route(kind, up))))
    if kind == "azure_openai":
        cut: dict[str, Any] = {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-4o",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": finish,
                    "message": {"role": "assistant", "content": "Once"},
                }
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }
    else:
        cut = {"promptFeedback": {"blockReason": finish}, "usageMetadata": {"promptTokenCount": 3}}
    up.set_default(Reply(200, body=cut))

    chat = await gw.openai().chat.completions.create(model="m", messages=HI)
    message = await gw.anthropic().messages.create(model="m", max_tokens=9, messages=HI)

    assert chat.choices[0].finish_reason == "content_filter"
    assert message.stop_reason == "refusal"
    assert len(up.requests) == 2


PRICING = {"prompt": 2.0, "completion": 10.0, "input_cache_reads": 0.5}
COST = (6 * 2.0 + 4 * 0.5 + 5 * 10.0) / 1e6  # USAGE: 6 uncached and 4 cached prompt tokens


@pytest.mark.parametrize("kind", [*KINDS, "bedrock"])
async def test_platform_route_is_priced_from_its_usage_cache_reads_included(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, tmp_path: Path, kind: str
) -> None:
    if kind == "bedrock":
        up: FakeUpstream = FakeBedrock("up1", cached_tokens=USAGE[2])
        await up.start()
        platform = {
            "kind": "bedrock",
            "base_url": up.base_url,
            "bedrock": {"region": BEDROCK_REGION},
            "provider_model_id": "amazon.nova-lite-v1:0",
            "api_key": BEDROCK_KEY,
        }
    else:
        up = await fake_upstreams("up1", cached_tokens=USAGE[2])
        platform = platform_route(kind, up)
    try:
        gw = await gateway_factory(
            keys_config(tmp_path, model("m", {**platform, "pricing": PRICING}))
        )
        plain = await gw.openai().chat.completions.create(model="m", messages=HI)
        streamed = await gw.openai().chat.completions.create(
            model="m", messages=HI, stream=True, stream_options={"include_usage": True}
        )
        usage = [c.usage async for c in streamed if c.usage is not None]
        log = await admin_http(gw).post("/admin/log/query", json={"kind": "request"})
    finally:
        if kind == "bedrock":
            await up.close()

    assert plain.usage is not None and usage
    for got in (plain.usage, usage[-1]):
        assert got.prompt_tokens_details is not None
        cached = got.prompt_tokens_details.cached_tokens
        assert (got.prompt_tokens, got.completion_tokens, cached) == USAGE
    rows = log.json()["rows"]
    assert [(r["stream"], r["cached_tokens"]) for r in rows] == [(0, 4), (1, 4)]
    assert all(r["cost_usd"] == pytest.approx(COST) and not r["cost_estimated"] for r in rows)


async def test_health_deep_routing_and_explain_show_the_platform_routes(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    azure_up = await fake_upstreams("az")
    gemini_up = await fake_upstreams("gm")
    routes = (platform_route("azure_openai", azure_up), platform_route("gemini", gemini_up))
    gw = await gateway_factory(config(model("m", *routes), admin_key=ADMIN))
    admin = {"authorization": f"Bearer {ADMIN}"}
    endpoints = {eid("m", azure_up): "azure_openai", eid("m", gemini_up): "gemini"}

    deep = (await gw.http().get("/health/deep", headers=admin)).json()
    routing = (await gw.http().get("/routing", headers=admin)).json()
    explained = await gw.http().post(
        "/admin/routing/explain",
        headers=admin,
        json={"path": "/v1/chat/completions", "body": {"model": "m", "messages": HI}},
    )

    rows = {e: deep["endpoints"][e] for e in endpoints}
    assert all(r["circuit_state"] == "closed" and r["healthy"] for r in rows.values())
    listed = {r["endpoint"]: r["provider"] for r in routing["models"]["m"]["routes"]}
    assert listed == endpoints
    assert explained.status_code == 200, explained.text
    planned = {c["endpoint"]: c["kind"] for c in explained.json()["plan"]["candidates"]}
    assert planned == endpoints
    assert not azure_up.requests and not gemini_up.requests  # explain calls no upstream
    assert KEY not in json.dumps([deep, routing, explained.json()])
