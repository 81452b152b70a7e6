"""Bad input never yields a 500 or a stack trace: every refusal is an OpenAI-shaped error with
the right status. Runs on ``inproc://`` and on NATS (``bus_url``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import openai
import pytest

from tests.e2e.conftest import (
    CHAT,
    HI,
    assert_openai_error,
    chat,
    config,
    eid,
    endpoint_states,
    model,
    route,
)
from tests.fixtures.upstream import FakeUpstream, Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

LIMIT = 4096


@pytest.fixture
async def gw(gateway_factory: GatewayFactory, fake_upstream: FakeUpstream) -> RunningGateway:
    """A gateway with model ``m`` on the fake upstream and a small body limit."""
    return await gateway_factory(
        config(
            model("m", route(fake_upstream), aliases=["m-alias"]), server={"max_body_bytes": LIMIT}
        )
    )


@pytest.fixture
async def edge_gw(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, engine: str
) -> RunningGateway:
    """As ``gw``, on each HTTP engine: for the tests of what the server reads (bodies)."""
    return await gateway_factory(
        config(
            model("m", route(fake_upstream)),
            server={"max_body_bytes": LIMIT, "engine": engine},
        )
    )


@pytest.mark.parametrize("raw", [b"{not json", b"", b"\xff\xfe", b'{"model": "m", "messages": ['])
async def test_chat_with_malformed_json_is_400(edge_gw: RunningGateway, raw: bytes) -> None:
    json_type = {"content-type": "application/json"}
    resp = await edge_gw.http().post(CHAT, content=raw, headers=json_type)

    err = assert_openai_error(resp, 400, "invalid_request")
    assert "JSON" in err["message"]


BAD_FIELDS: dict[str, tuple[Any, str]] = {
    "not_an_object": ([1, 2], ""),
    "model_missing": ({"messages": HI}, "model"),
    "model_not_a_string": ({"model": 7, "messages": HI}, "model"),
    "model_empty": ({"model": "", "messages": HI}, "model"),
    "messages_missing": ({"model": "m"}, "messages"),
    "messages_not_an_array": ({"model": "m", "messages": "hi"}, "messages"),
    "messages_empty": ({"model": "m", "messages": []}, "messages"),
    "message_not_an_object": ({"model": "m", "messages": ["hi"]}, "messages[0]"),
    "message_role_unknown": (
        {"model": "m", "messages": [{"role": "robot", "content": "x"}]},
        "messages[0].role",
    ),
    # An object or a list where the role goes was a 500 (unhashable, found by a fuzzer).
    "message_role_an_object": (
        {"model": "m", "messages": [{"role": {}, "content": "x"}]},
        "messages[0].role",
    ),
    "message_role_a_list": (
        {"model": "m", "messages": [{"role": ["user"], "content": "x"}]},
        "messages[0].role",
    ),
    "stream_not_a_boolean": ({"model": "m", "messages": HI, "stream": "yes"}, "stream"),
    "include_usage_not_a_boolean": (
        {"model": "m", "messages": HI, "stream": True, "stream_options": {"include_usage": 1}},
        "stream_options.include_usage",
    ),
}


@pytest.mark.parametrize(("body", "field"), BAD_FIELDS.values(), ids=BAD_FIELDS.keys())
async def test_chat_with_missing_or_mistyped_field_is_400_naming_it(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
    body: Any,
    field: str,
) -> None:
    resp = await gw.http().post(CHAT, json=body)

    err = assert_openai_error(resp, 400, "invalid_request")
    if field:
        assert err["param"] == field
        assert field.split("[")[0] in err["message"]
    assert fake_upstream.requests == []


async def test_chat_via_sdk_with_include_usage_not_a_boolean_is_400_naming_it(
    gw: RunningGateway, fake_upstream: FakeUpstream
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await gw.openai().chat.completions.create(
            model="m",
            messages=HI,
            stream=True,
            stream_options={"include_usage": "yes"},
        )

    assert refused.value.param == "stream_options.include_usage"
    assert fake_upstream.requests == []


async def test_chat_via_sdk_with_unknown_model_is_404(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        await gw.openai().chat.completions.create(model="no-such-model", messages=HI)

    err = assert_openai_error(exc.value.response, 404, "route_not_found")
    assert "no-such-model" in err["message"]
    assert fake_upstream.requests == []


async def test_chat_over_the_body_limit_is_413_and_just_under_is_served(
    edge_gw: RunningGateway,
    fake_upstream: FakeUpstream,
) -> None:
    def padded(size: int) -> bytes:
        head = b'{"model": "m", "messages": [{"role": "user", "content": "'
        tail = b'"}]}'
        return head + b"x" * (size - len(head) - len(tail)) + tail

    http = edge_gw.http()
    over = await http.post(
        CHAT, content=padded(LIMIT + 1), headers={"content-type": "application/json"}
    )

    async def chunks() -> Any:  # no content-length: the limit holds while streaming in too
        body = padded(LIMIT * 3)
        for i in range(0, len(body), 1000):
            yield body[i : i + 1000]

    streamed = await http.post(CHAT, content=chunks(), headers={"content-type": "application/json"})
    under = await http.post(
        CHAT, content=padded(LIMIT), headers={"content-type": "application/json"}
    )

    assert_openai_error(over, 413, "request_too_large")
    assert_openai_error(streamed, 413, "request_too_large")
    assert under.status_code == 200, under.text
    assert len(fake_upstream.requests) == 1


async def test_chat_via_sdk_over_the_body_limit_raises_413(edge_gw: RunningGateway) -> None:
    with pytest.raises(openai.APIStatusError) as exc:
        await edge_gw.openai().chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x" * LIMIT}]
        )

    assert exc.value.status_code == 413


async def test_default_body_limit_is_32_mib(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    gw = await gateway_factory(config(model("m", route(fake_upstream))))

    resp = await gw.http().post(
        CHAT,
        content=b"{" + b" " * (32 * 1024 * 1024) + b"}",
        headers={"content-type": "application/json"},
    )

    assert gw.config.server.max_body_bytes == 32 * 1024 * 1024
    assert_openai_error(resp, 413, "request_too_large")


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("GET", "/v1/nothing-here", 404, None),
        ("GET", CHAT, 405, "POST"),
        ("POST", "/v1/models", 405, "GET"),
    ],
)
async def test_unknown_path_or_method_is_an_openai_shaped_error(
    gw: RunningGateway,
    method: str,
    path: str,
    status: int,
    allow: str | None,
) -> None:
    resp = await gw.http().request(method, path)

    assert_openai_error(resp, status)
    assert resp.headers.get("allow") == allow  # RFC 9110: a 405 names the methods allowed


GARBAGE: dict[str, Reply] = {
    "html": Reply(200, body="<html>502 Bad Gateway</html>"),
    "broken_json": Reply(200, body='{"choices": [', headers={"content-type": "application/json"}),
    "json_without_choices": Reply(200, body={"hello": "world"}),
    "json_array": Reply(200, body=[1, 2, 3]),
}


@pytest.mark.parametrize("reply", GARBAGE.values(), ids=GARBAGE.keys())
async def test_upstream_garbage_is_502_with_a_clear_message_and_an_endpoint_failure(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
    reply: Reply,
) -> None:
    fake_upstream.enqueue(reply)

    async with endpoint_states(gw, eid("m", fake_upstream)) as states:
        resp = await gw.http().post(CHAT, json=chat("m"))
        state = await states.state(lambda s: s.consecutive_failures > 0)

    err = assert_openai_error(resp, 502, "upstream_bad_response")
    assert "invalid response" in err["message"]
    assert state.consecutive_failures == 1
    assert state.availability == pytest.approx(0.9)


async def test_upstream_garbage_in_a_stream_before_first_chunk_is_502(
    gw: RunningGateway,
    fake_upstream: FakeUpstream,
) -> None:
    fake_upstream.enqueue(
        Reply(200, body="data: {oops\n\n", headers={"content-type": "text/event-stream"})
    )

    resp = await gw.http().post(CHAT, json=chat("m", stream=True))

    err = assert_openai_error(resp, 502, "upstream_bad_response")
    assert "invalid response" in err["message"]
