"""Routes of kind ``bedrock`` through the real gateway, on every client surface.

The official openai (chat, responses) and anthropic (messages) SDKs talk to the gateway; a
``bedrock`` route sends Converse/ConverseStream to :class:`FakeBedrock`, which validates each
body against botocore's service model and verifies each SigV4 signature. Covered: a chat, a
stream, a tool call round trip and a failover hop to bedrock on every surface; a throttled
answer is a rate limit that cools the key for its retry-after, never the circuit or a bench,
and a billing refusal mutes the key; a guardrail refusal reaches the client in its surface's
refusal form and is neither failed over nor counted as a failure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from schemas import BenchChanged, CircuitTransition, KeyCooling, KeyMuted, Observation, subjects
from schemas.config import credential_id
from tests.e2e._surface_clients import (
    DRIVERS,
    MAX_TOKENS,
    PREV_ARGS,
    PREV_CALL,
    PREV_RESULT,
    QUESTION,
    SYSTEM,
    TEMPERATURE,
    TOOL_NAME,
    TOOL_SCHEMA,
    Answer,
    refused,
)
from tests.e2e.conftest import CHAT, config, eid, endpoint_states, model, route, watch
from tests.fixtures.upstream import Reply, ToolCall, UpstreamFactory
from tests.fixtures.upstream_bedrock import BEDROCK_KEY, BEDROCK_REGION, FakeBedrock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import Recorded

pytestmark = pytest.mark.e2e

SURFACES = ("chat", "responses", "messages")
MODEL_ID = "anthropic.claude-3-5-sonnet-20240620-v1:0"  # the ':' must survive signing
NEW_CALL = "tooluse_new1"
NEW_ARGS = '{"city":"Paris","unit":"c"}'
USAGE = (10, 5, 4)  # prompt tokens (4 of them cache reads), completion tokens, cached
REFUSAL = "Sorry, the model cannot answer this question."
SECOND_KEY = "AKIDFAKEBEDROCK2:fake-bedrock-secret-2"
TINY = 1e-6
# AccessDeniedException is how Bedrock refuses an account whose billing cannot pay the model.
BILLING_REFUSAL = Reply(
    403,
    body={"message": "INVALID_PAYMENT_INSTRUMENT:A valid payment instrument must be provided."},
    headers={"x-amzn-ErrorType": "AccessDeniedException:http://internal.amazon.com/coral/"},
)
_PREV_USE = {"toolUseId": PREV_CALL, "name": TOOL_NAME, "input": PREV_ARGS}


def bedrock_route(up: FakeBedrock, **extra: Any) -> dict[str, Any]:
    """A ``bedrock`` route to ``up``, signed with the key it knows."""
    return {
        "kind": "bedrock",
        "base_url": up.base_url,
        "bedrock": {"region": BEDROCK_REGION},
        "provider_model_id": MODEL_ID,
        "api_key": BEDROCK_KEY,
        **extra,
    }


@pytest.fixture
async def bedrock() -> AsyncIterator[FakeBedrock]:
    up = FakeBedrock("bedrock1", cached_tokens=USAGE[2], chunks=4)
    await up.start()
    try:
        yield up
    finally:
        await up.close()


def _assert_bedrock_saw(rec: Recorded, *, tools: bool, stream: bool) -> None:
    # The signature verified over the path as sent, so the model id went out as signed.
    assert rec.credential == BEDROCK_KEY
    assert (rec.model, rec.stream) == (MODEL_ID, stream)
    body = rec.json
    assert body["system"] == [{"text": SYSTEM}]
    assert body["inferenceConfig"] == {"maxTokens": MAX_TOKENS, "temperature": TEMPERATURE}
    msgs = body["messages"]
    assert msgs[0] == {"role": "user", "content": [{"text": QUESTION}]}
    if not tools:
        assert len(msgs) == 1 and "toolConfig" not in body
        return
    assert msgs[1:] == [
        {
            "role": "assistant",
            "content": [{"toolUse": _PREV_USE}],
        },
        {
            "role": "user",
            "content": [
                {
                    "toolResult": {
                        "toolUseId": PREV_CALL,
                        "content": [{"text": PREV_RESULT}],
                        "status": "success",
                    }
                }
            ],
        },
    ]
    (tool,) = body["toolConfig"]["tools"]
    assert tool["toolSpec"]["name"] == TOOL_NAME
    assert tool["toolSpec"]["inputSchema"] == {"json": TOOL_SCHEMA}


@pytest.mark.parametrize("surface", SURFACES)
async def test_bedrock_route_answers_plain_and_streamed_with_usage(
    gateway_factory: GatewayFactory, bedrock: FakeBedrock, surface: str
) -> None:
    gw = await gateway_factory(config(model("m", bedrock_route(bedrock))))
    driver = DRIVERS[surface](gw)

    plain = await driver.plain()
    streamed = await driver.stream()

    assert plain == Answer(bedrock.text, driver.stops[0], USAGE, routed_via=eid("m", bedrock))
    assert len(streamed.deltas) == 4 and "".join(streamed.deltas) == bedrock.text
    assert (streamed.text, streamed.stop, streamed.usage) == (bedrock.text, driver.stops[0], USAGE)
    first, second = bedrock.requests
    _assert_bedrock_saw(first, tools=False, stream=False)
    _assert_bedrock_saw(second, tools=False, stream=True)


@pytest.mark.parametrize("surface", SURFACES)
async def test_bedrock_route_tool_calls_round_trip_plain_and_streamed(
    gateway_factory: GatewayFactory, bedrock: FakeBedrock, surface: str
) -> None:
    gw = await gateway_factory(config(model("m", bedrock_route(bedrock))))
    bedrock.set_default(ToolCall(TOOL_NAME, NEW_ARGS, call_id=NEW_CALL))
    driver = DRIVERS[surface](gw)

    plain = await driver.plain(tools=True)
    streamed = await driver.stream(tools=True)

    for got in (plain, streamed):
        assert got.calls == [(NEW_CALL, TOOL_NAME, NEW_ARGS)]
        assert (got.text, got.stop, got.usage) == ("", driver.stops[1], USAGE)
    assert len(streamed.deltas) > 1 and "".join(streamed.deltas) == NEW_ARGS
    _assert_bedrock_saw(bedrock.requests[0], tools=True, stream=False)
    _assert_bedrock_saw(bedrock.requests[1], tools=True, stream=True)


@pytest.mark.parametrize("surface", SURFACES)
async def test_failover_hops_from_a_failing_route_to_bedrock(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    bedrock: FakeBedrock,
    surface: str,
) -> None:
    broken = await fake_upstreams("broken", default=Reply(503))
    gw = await gateway_factory(
        config(model("m", route(broken), bedrock_route(bedrock, fallback_only=True)))
    )
    driver = DRIVERS[surface](gw)

    plain = await driver.plain()
    streamed = await driver.stream()

    for got in (plain, streamed):
        assert (got.text, got.routed_via) == (bedrock.text, eid("m", bedrock))
    assert len(broken.requests) == 2 and len(bedrock.requests) == 2


async def test_bedrock_throttle_cools_the_key_for_its_retry_after_never_the_circuit_or_bench(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    bedrock = FakeBedrock("bedrock1", keys=(BEDROCK_KEY, SECOND_KEY))
    await bedrock.start()
    try:
        spare = await fake_upstreams("spare")
        keys = {"api_key": None, "api_keys": [BEDROCK_KEY, SECOND_KEY]}
        gw = await gateway_factory(
            config(model("m", bedrock_route(bedrock, **keys), route(spare, weight=TINY)))
        )
        endpoint = eid("m", bedrock)
        bedrock.enqueue(Reply(429, headers={"Retry-After": "7"}), Reply(500))  # Throttling, then

        async with (
            watch(gw, subjects.observation(endpoint)) as obs,
            watch(gw, subjects.event("keypool")) as key_events,
            watch(gw, subjects.event("bench")) as benches,
            watch(gw, subjects.event("circuit")) as circuits,
            endpoint_states(gw, endpoint) as states,
        ):
            got = await DRIVERS["chat"](gw).plain()
            throttled = await obs.next(Observation)
            cooled = await key_events.next(KeyCooling, lambda e: e.pool == endpoint)
            # A barrier: the other key is free, so the route still serves, and fails for real;
            # observations of one endpoint are handled in order, so this state has the 429.
            await DRIVERS["chat"](gw).plain()
            state = await states.state(lambda s: s.consecutive_failures > 0)
    finally:
        await bedrock.close()

    assert got.text == spare.text  # passed over, not waited for
    assert (throttled.status, throttled.retry_after, throttled.error_kind) == (
        429,
        7.0,
        "rate_limited",
    )
    assert not throttled.auth_rejection
    assert cooled.hinted and cooled.seconds == pytest.approx(7.0, abs=0.5)
    assert (state.circuit_state, state.consecutive_failures) == ("closed", 1)  # the 500 only
    assert not [e for e in circuits.seen if isinstance(e, CircuitTransition)]
    assert not [e for e in benches.seen if isinstance(e, BenchChanged)]
    assert not [e for e in key_events.seen if isinstance(e, KeyMuted)]
    assert [r.credential for r in bedrock.requests] == [BEDROCK_KEY, SECOND_KEY]


async def test_bedrock_billing_refusal_mutes_the_key_and_the_route_serves_on_the_other(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory
) -> None:
    bedrock = FakeBedrock("bedrock1", keys=(BEDROCK_KEY, SECOND_KEY))
    await bedrock.start()
    try:
        spare = await fake_upstreams("spare")
        keys = {"api_key": None, "api_keys": [BEDROCK_KEY, SECOND_KEY]}
        gw = await gateway_factory(
            config(model("m", bedrock_route(bedrock, **keys), route(spare, weight=TINY)))
        )
        bedrock.enqueue(BILLING_REFUSAL)

        async with watch(gw, subjects.event("keypool")) as key_events:
            got = await DRIVERS["chat"](gw).plain()
            muted = await key_events.next(KeyMuted, lambda e: e.pool == eid("m", bedrock))
    finally:
        await bedrock.close()

    assert got.text == bedrock.text  # the same route, on its other key
    assert [r.credential for r in bedrock.requests] == [BEDROCK_KEY, SECOND_KEY]
    assert not spare.requests
    assert muted.credential_id == credential_id(BEDROCK_KEY)
    assert not [e for e in key_events.seen if isinstance(e, KeyCooling)]


@pytest.mark.parametrize("stream", [False, True], ids=["once", "stream"])
@pytest.mark.parametrize("surface", SURFACES)
async def test_bedrock_guardrail_refusal_reaches_the_client_and_is_not_failed_over(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    bedrock: FakeBedrock,
    surface: str,
    stream: bool,
) -> None:
    spare = await fake_upstreams("spare")
    gw = await gateway_factory(
        config(model("m", bedrock_route(bedrock), route(spare, fallback_only=True)))
    )
    bedrock.text, bedrock.stop_reason = REFUSAL, "guardrail_intervened"

    async with watch(gw, subjects.observation(eid("m", bedrock))) as obs:
        raw = await refused(gw, surface, stream)
        seen = await obs.next(Observation)

    assert (
        raw
        == {
            "chat": ("content_filter", REFUSAL),
            "responses": ("incomplete", "content_filter"),
            "messages": ("refusal", REFUSAL),
        }[surface]
    )
    assert seen.outcome == "success" and seen.status == 200
    assert spare.requests == []


async def test_bedrock_endpoint_has_a_health_deep_row_and_explain_names_its_kind(
    gateway_factory: GatewayFactory, bedrock: FakeBedrock
) -> None:
    admin = "bedrock-admin-key"
    gw = await gateway_factory(config(model("m", bedrock_route(bedrock)), admin_key=admin))
    http = gw.http(headers={"authorization": f"Bearer {admin}"})
    endpoint = eid("m", bedrock)

    deep = (await http.get("/health/deep")).json()
    explained = await http.post(
        "/admin/routing/explain",
        json={
            "path": CHAT,
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        },
    )

    row = deep["endpoints"][endpoint]
    assert (row["model"], row["circuit_state"], row["base_url"]) == (
        "m",
        "closed",
        bedrock.base_url,
    )
    assert explained.status_code == 200, explained.text
    (candidate,) = explained.json()["plan"]["candidates"]
    assert (candidate["endpoint"], candidate["kind"]) == (endpoint, "bedrock")
    assert candidate["upstream_model"] == MODEL_ID
    assert bedrock.requests == []  # neither sent anything upstream
