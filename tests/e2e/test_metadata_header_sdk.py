"""The ``x-llmgw-metadata`` header on every surface, through the official SDKs: a JSON object
of string, number or boolean labels within 4 KiB, 32 keys and 128 UTF-8 bytes a string is
taken; anything else is a 400
in the caller's own shape (OpenAI's on chat, Responses and embeddings, Anthropic's on
/v1/messages), never a 500. Runs on ``inproc://`` and on NATS."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest

from schemas.rules import MAX_LABEL_BYTES
from tests.e2e.conftest import HI, ONE_BUS, assert_openai_error, config, model, route

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

HEADER = "x-llmgw-metadata"
GOOD = json.dumps({"team": "search", "batch": True, "priority": 3, "ratio": 0.5})
BAD: dict[str, str] = {
    "not_json": "{team: search",
    "an_array": '["a", "b"]',
    "a_string": '"team"',
    "a_null_value": '{"team": null}',
    "a_nested_value": '{"team": {"name": "x"}}',
    "a_list_value": '{"team": ["x"]}',
    "an_empty_name": '{"": "x"}',
    "too_many_keys": json.dumps({f"k{i}": i for i in range(33)}),
    "too_long": json.dumps({"blob": "x" * 4090}),
    # Fewer characters than the bound, more UTF-8 bytes.
    "a_long_label": json.dumps({"team": "\u00e9" * (MAX_LABEL_BYTES // 2 + 1)}),
    # Within the byte bound, yet deep enough to exhaust an untyped JSON decoder's recursion.
    "a_deep_array": "[" * 1500 + "]" * 1500,
    "a_deep_value": '{"team": ' + "[" * 1500 + "]" * 1500 + "}",
}


@pytest.fixture
async def gw(gateway_factory: GatewayFactory, fake_upstream: FakeUpstream) -> RunningGateway:
    """A gateway with model ``m`` on one openai_compat fake upstream."""
    return await gateway_factory(config(model("m", route(fake_upstream))))


async def _chat(gw: RunningGateway, headers: dict[str, str]) -> Any:
    return await gw.openai().chat.completions.create(model="m", messages=HI, extra_headers=headers)


async def _responses(gw: RunningGateway, headers: dict[str, str]) -> Any:
    return await gw.openai().responses.create(model="m", input="hi", extra_headers=headers)


async def _embeddings(gw: RunningGateway, headers: dict[str, str]) -> Any:
    return await gw.openai().embeddings.create(model="m", input="hi", extra_headers=headers)


async def _messages(gw: RunningGateway, headers: dict[str, str]) -> Any:
    return await gw.anthropic().messages.create(
        model="m", max_tokens=16, messages=HI, extra_headers=headers
    )


OPENAI_SURFACES = {"chat": _chat, "responses": _responses, "embeddings": _embeddings}


@pytest.mark.parametrize(
    "call", [*OPENAI_SURFACES.values(), _messages], ids=[*OPENAI_SURFACES, "messages"]
)
async def test_labels_within_bounds_are_taken_on_every_surface(
    gw: RunningGateway, call: Any
) -> None:
    at_bounds = json.dumps({f"k{i:02d}": "v" * 100 for i in range(32)})
    longest = json.dumps({"team": "\u00e9" * (MAX_LABEL_BYTES // 2)})
    assert len(at_bounds) <= 4096
    for value in (GOOD, at_bounds, longest, "{}"):
        assert await call(gw, {HEADER: value}) is not None


@pytest.mark.parametrize("surface", OPENAI_SURFACES)
@pytest.mark.parametrize("value", BAD.values(), ids=BAD.keys())
async def test_a_bad_header_is_an_openai_400(gw: RunningGateway, surface: str, value: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await OPENAI_SURFACES[surface](gw, {HEADER: value})

    err = assert_openai_error(info.value.response, 400, "invalid_request")
    assert err["param"] == HEADER and HEADER in err["message"]


@pytest.mark.parametrize("value", BAD.values(), ids=BAD.keys())
async def test_a_bad_header_is_an_anthropic_400_on_messages(gw: RunningGateway, value: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        await _messages(gw, {HEADER: value})

    resp = info.value.response
    assert resp.status_code == 400
    body = resp.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert body["error"]["type"] == "invalid_request_error", body
    assert HEADER in body["error"]["message"]
