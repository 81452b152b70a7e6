"""A Gemini answer that stops having said nothing (``finishReason: STOP``, no text and no
function call: no parts, an empty text, or only thoughts; a flake of Gemini's thinking models)
is no answer, end to end: through the official openai SDK (chat, responses) and anthropic SDK
(messages) against the fake Gemini API, the next route serves, plain and streamed; with no
other route, the client gets a 502 in its API's shape (never a 500, never an empty success),
and the attempt never counts against the Gemini route (one caller's conversation must not
open its circuit). A stream
that already relayed something (its thoughts) ends in the dialect's stream error.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest

from schemas import Observation, subjects
from tests.e2e._surface_clients import DRIVERS
from tests.e2e.bad_answers_support import SSE, TINY, ended_in_error, post, start_gateway
from tests.e2e.conftest import ONE_BUS, eid, route, watch
from tests.fixtures.upstream import FakeUpstream, Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import UpstreamFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

SURFACES = ("chat", "responses", "messages")
THOUGHT = {"text": "the user wants the weather", "thought": True}
EMPTY: dict[str, list[dict[str, Any]]] = {"no parts": [], "only thoughts": [THOUGHT]}


def _gemini_route(up: FakeUpstream) -> dict[str, Any]:
    return {
        "kind": "gemini",
        "base_url": up.gemini_base_url,
        "provider_model_id": "g",
        "api_key": "k",
    }


def _empty_stop(parts: list[dict[str, Any]], stream: bool) -> Reply:
    """Gemini's answer that stops with ``parts`` (as a stream: one event)."""
    answer = {
        "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP"}],
        "usageMetadata": {"promptTokenCount": 7, "thoughtsTokenCount": 5},
        "responseId": "r-empty",
    }
    if not stream:
        return Reply(body=answer)
    return Reply(body=f"data: {json.dumps(answer)}\n\n".encode(), headers=SSE)


async def _gemini(fake_upstreams: UpstreamFactory, parts: list[Any], stream: bool) -> FakeUpstream:
    up = await fake_upstreams("gem")
    up.set_default(_empty_stop(parts, stream))
    return up


async def _ask(gw: RunningGateway, surface: str, stream: bool) -> Any:
    driver = DRIVERS[surface](gw)
    return await (driver.stream() if stream else driver.plain())


@pytest.mark.parametrize("case", EMPTY)
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("surface", SURFACES)
async def test_an_empty_gemini_stop_fails_over_to_the_next_route(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    surface: str,
    stream: bool,
    case: str,
) -> None:
    # The empty STOP was relayed as a successful answer with no text: the client took
    # nothing for the answer, and the other route never served.
    gemini, good = await _gemini(fake_upstreams, EMPTY[case], stream), await fake_upstreams()
    gw = await start_gateway(gateway_factory, _gemini_route(gemini), route(good, TINY))

    answer = await _ask(gw, surface, stream)

    assert answer.text and answer.routed_via == eid("m", good), answer
    assert answer.stop in ("stop", "completed", "end_turn"), answer
    assert len(gemini.requests) == 1 and len(good.requests) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("surface", SURFACES)
async def test_an_empty_gemini_stop_with_no_other_route_is_a_502_in_the_surface_shape(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    surface: str,
    stream: bool,
) -> None:
    gemini = await _gemini(fake_upstreams, EMPTY["only thoughts"], stream)
    gw = await start_gateway(gateway_factory, _gemini_route(gemini))

    async with watch(gw, subjects.observation(eid("m", gemini))) as obs:
        with pytest.raises((openai.APIStatusError, anthropic.APIStatusError)) as caught:
            await _ask(gw, surface, stream)
        seen = await obs.next(Observation)

    err = caught.value
    assert isinstance(err, openai.APIStatusError | anthropic.APIStatusError)
    assert err.status_code == 502, err
    body = err.response.json()  # the whole body (the openai SDK's err.body is its "error")
    assert (body.get("type") == "error") == (surface == "messages"), body
    error = body["error"]
    assert "empty answer" in error["message"] and "only thoughts" in error["message"], body
    if surface != "messages":
        assert error["code"] == "upstream_bad_response", body
    # Not the endpoint's failure: a conversation can make a model answer empty every time.
    assert (seen.outcome, seen.error_kind) == ("client_error", "bad_response"), seen


@pytest.mark.parametrize("surface", SURFACES)
async def test_a_gemini_stream_that_relayed_its_thoughts_then_stopped_empty_ends_in_error(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    surface: str,
) -> None:
    # Its thoughts reached the client before the STOP said there is no answer: too late to
    # fail over, so it ends as a stream broken mid-way does, never as a finished answer.
    thinking = {"candidates": [{"content": {"role": "model", "parts": [THOUGHT]}}]}
    stop = {"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": "STOP"}]}
    gemini, good = await fake_upstreams("gem"), await fake_upstreams()
    sse = "".join(f"data: {json.dumps(a)}\n\n" for a in (thinking, stop))
    gemini.set_default(Reply(body=sse.encode(), headers=SSE))
    gw = await start_gateway(gateway_factory, _gemini_route(gemini), route(good, TINY))

    async with watch(gw, subjects.observation(eid("m", gemini))) as obs:
        status, body = await post(gw, surface, stream=True)
        seen = await obs.next(Observation)

    assert status == 200 and "the user wants the weather" in body, body
    assert ended_in_error(surface, body) and "empty answer" in body, body
    assert not good.requests
    assert (seen.outcome, seen.error_kind) == ("client_error", "bad_response"), seen
