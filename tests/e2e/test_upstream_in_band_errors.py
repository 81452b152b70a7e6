"""An ``openai_compat`` upstream's in-band stream error (``data: {"error": ...}`` in a 200
stream) is classified by the status it names, as the same error's HTTP answer would be:
vLLM streams its refusal of an overlong prompt this way (``code: 400``), LiteLLM's proxy and
OpenRouter-style servers theirs (``code: "400"``, or OpenAI's ``type``). Raw httpx on loopback
against the scripted fake upstream.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from schemas import Observation, subjects
from tests.e2e.bad_answers_support import SSE, post
from tests.e2e.conftest import ONE_BUS, config, eid, model, route, watch
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

SPEC_CIRCUIT = {"failure_threshold": 3, "cooldown_seconds": 30}  # the spec's defaults
TOO_LONG = "This model's maximum context length is 4096 tokens. However, you requested 9000"


def _in_band(error: dict[str, Any]) -> Reply:
    return Reply(200, body=f"data: {json.dumps({'error': error})}\n\n", headers=SSE)


REQUEST_ERRORS: dict[str, dict[str, Any]] = {
    "vllm": {"message": TOO_LONG, "type": "BadRequestError", "param": None, "code": 400},
    "litellm": {"message": TOO_LONG, "type": "None", "param": "None", "code": "400"},
    "openai": {
        "message": TOO_LONG,
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    },
}


@pytest.mark.parametrize("server", REQUEST_ERRORS)
async def test_an_in_band_error_naming_the_callers_request_is_never_the_routes_failure(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, server: str
) -> None:
    # It had no status, so it read as "no answer": the route's failure and a key-specific one.
    # Three of one caller's overlong prompts opened the route's circuit and muted its only key
    # for every caller.
    fake_upstream.set_default(_in_band(REQUEST_ERRORS[server]))
    gw = await gateway_factory(
        config(model("m", route(fake_upstream, api_key="sk-only")), circuit=SPEC_CIRCUIT)
    )

    async with watch(gw, subjects.observation(eid("m", fake_upstream))) as obs:
        answers = [await post(gw, "chat", stream=True) for _ in range(3)]
        seen = [await obs.next(Observation) for _ in range(3)]

    assert [(o.outcome, o.status) for o in seen] == [("client_error", 400)] * 3
    for status, body in answers:
        assert status == 400 and "maximum context length" in body, body
    fake_upstream.set_default(Reply())
    last = await post(gw, "chat", stream=True)
    assert last[0] == 200, last  # neither its circuit opened nor its only key was muted


# A code naming no status: none at all, digits int() refuses ("²", 5,000 of them: a
# ValueError out of the adapter), a number outside 400-599.
NO_STATUS = {"none": None, "superscript": "²", "huge": "9" * 5000, "200": 200}


@pytest.mark.parametrize("code", NO_STATUS.values(), ids=NO_STATUS.keys())
async def test_an_in_band_server_error_is_still_the_routes_failure(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, code: object
) -> None:
    error = {"message": "overloaded", "type": "server_error", "param": None, "code": code}
    fake_upstream.set_default(_in_band(error))
    gw = await gateway_factory(config(model("m", route(fake_upstream)), circuit=SPEC_CIRCUIT))

    async with watch(gw, subjects.observation(eid("m", fake_upstream))) as obs:
        status, body = await post(gw, "chat", stream=True)
        seen = await obs.next(Observation)

    assert (seen.outcome, seen.status, seen.error_kind) == ("failure", None, "stream_error")
    assert status == 502 and "overloaded" in body, body
