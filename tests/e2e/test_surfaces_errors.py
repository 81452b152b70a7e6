"""Every error on a surface comes in that surface's own shape: OpenAI's ``{"error": {...}}``
on /v1/chat/completions and /v1/responses, Anthropic's ``{"type": "error", "error": {...}}``
on /v1/messages, whether the gateway refused the request (bad JSON, bad fields, unknown
model, wrong method) or the upstream failed. Runs on ``inproc://`` and on NATS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest

from tests.e2e._surface_clients import error_body
from tests.e2e.conftest import (
    CHAT,
    HI,
    ONE_BUS,
    anthropic_route,
    assert_openai_error,
    config,
    model,
    route,
)
from tests.fixtures.upstream import FakeUpstream, Reply

if TYPE_CHECKING:
    import httpx

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
NOT_JSON = b'{"model": "m", '


@pytest.fixture
async def gw(gateway_factory: GatewayFactory, fake_upstream: FakeUpstream) -> RunningGateway:
    """A gateway with model ``m`` on one openai_compat fake upstream."""
    return await gateway_factory(config(model("m", route(fake_upstream))))


def assert_anthropic_error(resp: httpx.Response, status: int, kind: str) -> str:
    """``resp`` is an Anthropic-shaped error with ``status`` and ``error.type``; its message."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"}, body
    assert body["error"]["type"] == kind, body
    assert body["error"]["message"] and "Traceback" not in resp.text
    return str(body["error"]["message"])


BAD: dict[str, tuple[str, Any, int, str, str]] = {
    # id: (path, body (bytes are sent raw), status, param or error type, in the message)
    "chat_not_json": (CHAT, NOT_JSON, 400, "", "JSON"),
    "chat_no_messages": (CHAT, {"model": "m"}, 400, "messages", "messages"),
    "chat_unknown_model": (CHAT, {"model": "nope", "messages": HI}, 404, "", "nope"),
    "responses_not_json": (RESPONSES, NOT_JSON, 400, "", "JSON"),
    "responses_not_an_object": (RESPONSES, [1], 400, "body", "object"),
    "responses_no_input": (RESPONSES, {"model": "m"}, 400, "input", "input"),
    "responses_previous_id": (
        RESPONSES,
        {"model": "m", "input": "hi", "previous_response_id": "resp_1"},
        400,
        "previous_response_id",
        "stateless",
    ),
    "responses_hosted_tool": (
        RESPONSES,
        {"model": "m", "input": "hi", "tools": [{"type": "web_search"}]},
        400,
        "tools[0].type",
        "web_search",
    ),
    "responses_tool_not_an_object": (
        RESPONSES,
        {"model": "m", "input": "hi", "tools": ["x"]},
        400,
        "tools[0]",
        "must be an object",
    ),
    "responses_unknown_model": (RESPONSES, {"model": "nope", "input": "hi"}, 404, "", "nope"),
    "messages_not_json": (MESSAGES, NOT_JSON, 400, "invalid_request_error", "JSON"),
    "messages_no_max_tokens": (
        MESSAGES,
        {"model": "m", "messages": HI},
        400,
        "invalid_request_error",
        "max_tokens",
    ),
    "messages_bad_role": (
        MESSAGES,
        {"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]},
        400,
        "invalid_request_error",
        "role",
    ),
    "messages_file_image": (
        MESSAGES,
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "file", "file_id": "f_1"}}],
                }
            ],
        },
        400,
        "invalid_request_error",
        "image",
    ),
    # Claude's MCP connector calls the servers' tools itself: without it the model answers
    # with no tools at all, a different question (it was dropped without a word).
    "messages_mcp_servers": (
        MESSAGES,
        {
            "model": "m",
            "max_tokens": 5,
            "messages": HI,
            "mcp_servers": [{"type": "url", "url": "https://mcp.example.com", "name": "x"}],
        },
        400,
        "invalid_request_error",
        "mcp_servers",
    ),
    "messages_unknown_model": (
        MESSAGES,
        {"model": "nope", "max_tokens": 5, "messages": HI},
        404,
        "not_found_error",
        "nope",
    ),
}


@pytest.mark.parametrize(("path", "body", "status", "what", "text"), BAD.values(), ids=BAD.keys())
async def test_malformed_request_is_refused_in_the_surface_error_shape(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
    path: str,
    body: Any,
    status: int,
    what: str,
    text: str,
) -> None:
    if isinstance(body, bytes):
        resp = await gw.http().post(
            path, content=body, headers={"content-type": "application/json"}
        )
    else:
        resp = await gw.http().post(path, json=body)

    if path == MESSAGES:
        assert text in assert_anthropic_error(resp, status, what)
    else:
        err = assert_openai_error(resp, status)
        assert text in err["message"]
        assert err["param"] == (what or None)
    assert fake_upstream.requests == []


async def test_wrong_method_on_messages_is_405_in_anthropic_shape(gw: RunningGateway) -> None:
    resp = await gw.http().get(MESSAGES)

    assert_anthropic_error(resp, 405, "invalid_request_error")


async def test_sdks_raise_their_own_typed_errors_for_refusals(gw: RunningGateway) -> None:
    with pytest.raises(openai.BadRequestError) as stateful:
        await gw.openai().responses.create(model="m", input="hi", previous_response_id="resp_1")
    with pytest.raises(anthropic.NotFoundError) as unknown:
        await gw.anthropic().messages.create(model="nope", max_tokens=5, messages=HI)

    assert error_body(stateful.value)["param"] == "previous_response_id"
    assert error_body(unknown.value)["error"]["type"] == "not_found_error"


async def test_upstream_failures_on_messages_are_anthropic_shaped_with_retry_after(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
) -> None:
    # The 503 first: the 429 then cools the only route for its 7 s.
    fake_upstream.enqueue(Reply(503), Reply(429, headers={"Retry-After": "7"}))
    http = gw.http(headers={"x-api-key": "sk-client", "anthropic-version": "2023-06-01"})
    body = {"model": "m", "max_tokens": 5, "messages": HI}

    broken = await http.post(MESSAGES, json={**body, "stream": True})
    limited = await http.post(MESSAGES, json=body)

    assert_anthropic_error(limited, 429, "rate_limit_error")
    assert limited.headers["retry-after"] == "7"
    assert "HTTP 503" in assert_anthropic_error(broken, 502, "api_error")


@ONE_BUS
@pytest.mark.parametrize("status", [529, 503])
async def test_upstream_overload_reaches_a_messages_client_as_anthropic_529(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, status: int
) -> None:
    # Claude's 529 overloaded_error, after every route was tried, was a 502 api_error: the
    # anthropic SDK raised InternalServerError, not OverloadedError, and Claude Code could
    # not tell an overload (which it retries, and falls back from) from a broken gateway.
    # So was a 503 whose body says overloaded_error (Claude behind a proxy or another cloud).
    gw = await gateway_factory(config(model("m", anthropic_route(fake_upstream))))
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    fake_upstream.enqueue(Reply(status, body=overloaded), Reply(status, body=overloaded))

    with pytest.raises(anthropic.OverloadedError) as messages:
        await gw.anthropic().messages.create(model="m", max_tokens=5, messages=HI)
    with pytest.raises(openai.InternalServerError) as chat:
        await gw.openai().chat.completions.create(model="m", messages=HI)

    assert messages.value.status_code == 529
    assert error_body(messages.value)["error"]["type"] == "overloaded_error"
    assert "Overloaded" in error_body(messages.value)["error"]["message"]
    assert chat.value.status_code == 502  # the OpenAI surfaces have no 529
