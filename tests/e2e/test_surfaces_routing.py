"""Routing is the same whatever the client speaks: fallback across upstream kinds on every
surface, refusals of what a target kind cannot honour, embeddings with failover, the echo
demo upstream on every surface, and Anthropic upstream specifics (``base_url`` with ``/v1``,
in-stream ``error`` events). Runs on ``inproc://`` and on NATS.
"""

from __future__ import annotations

import importlib.resources
import math
from typing import TYPE_CHECKING

import anthropic
import openai
import pytest

from schemas import Observation, subjects
from tests.e2e._surface_clients import DRIVERS, error_body
from tests.e2e.conftest import HI, anthropic_route, config, eid, model, route, watch
from tests.fixtures.upstream import Reply, UpstreamFactory

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

SURFACES = ("chat", "responses", "messages")
# Fallback tests need failures that do not open a circuit mid-test.
PATIENT = {"failure_threshold": 5, "cooldown_seconds": 30}
_SSE = {"content-type": "text/event-stream"}


def _sse(*events: str) -> str:
    return "".join(f"event: {e.split(':', 1)[0]}\ndata: {e.split(':', 1)[1]}\n\n" for e in events)


_START = (
    'message_start:{"type":"message_start","message":{"id":"msg_1","type":"message",'
    '"role":"assistant","model":"x","content":[],"stop_reason":null,'
    '"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":1}}}'
)
_TEXT = (
    'content_block_start:{"type":"content_block_start","index":0,'
    '"content_block":{"type":"text","text":""}}',
    'content_block_delta:{"type":"content_block_delta","index":0,'
    '"delta":{"type":"text_delta","text":"partial"}}',
)
_OVERLOADED = 'error:{"type":"error","error":{"type":"overloaded_error","message":"busy"}}'


@pytest.mark.parametrize("primary", ["openai_compat", "anthropic"])
@pytest.mark.parametrize("surface", SURFACES)
async def test_failing_primary_falls_back_to_the_other_upstream_kind_identically(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    surface: str,
    primary: str,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    first, second = (
        (route, anthropic_route) if primary == "openai_compat" else (anthropic_route, route)
    )
    gw = await gateway_factory(config(model("m", first(a, 1), second(b, 1e-6)), circuit=PATIENT))
    a.set_default(Reply(500))
    driver = DRIVERS[surface](gw)

    async with (
        watch(gw, subjects.observation(eid("m", a))) as obs_a,
        watch(gw, subjects.observation(eid("m", b))) as obs_b,
    ):
        plain = await driver.plain()
        streamed = await driver.stream()
        failed = [await obs_a.next(Observation) for _ in range(2)]
        served = [await obs_b.next(Observation) for _ in range(2)]

    for got in (plain, streamed):
        assert (got.text, got.routed_via) == ("Hello from b.", eid("m", b))
    assert (len(a.requests), len(b.requests)) == (2, 2)
    assert [(o.outcome, o.status, o.attempt, o.surface, o.stream) for o in failed] == [
        ("failure", 500, 1, surface, False),
        ("failure", 500, 1, surface, True),
    ]
    assert [(o.outcome, o.attempt, o.fallback, o.surface) for o in served] == [
        ("success", 2, True, surface)
    ] * 2


async def test_param_anthropic_cannot_honour_is_400_naming_it_unless_another_kind_serves(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(
        config(
            model("only-anthropic", anthropic_route(a)),
            model("mixed", anthropic_route(a, 1), route(b, 1e-6)),
            circuit=PATIENT,
        )
    )
    client = gw.openai()

    with pytest.raises(openai.BadRequestError) as exc:
        await client.chat.completions.create(model="only-anthropic", messages=HI, n=2)
    served = await client.chat.completions.with_raw_response.create(model="mixed", messages=HI, n=2)
    # Parameters Anthropic has no equivalent for and that change no answer's validity go.
    dropped = await client.chat.completions.create(
        model="only-anthropic", messages=HI, frequency_penalty=0.5, seed=7
    )

    assert error_body(exc.value)["param"] == "n" and "n:" in exc.value.message
    assert served.headers["x-routed-via"] == eid("mixed", b)
    assert b.requests[-1].json["n"] == 2
    assert dropped.choices[0].message.content == "Hello from a."
    assert len(a.requests) == 1  # the refusals sent nothing upstream
    assert not {"frequency_penalty", "seed"} & set(a.requests[0].json)


async def test_messages_parameters_chat_lacks_are_dropped_and_refusals_are_anthropic_shaped(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a = await fake_upstreams("a")
    gw = await gateway_factory(config(model("m", route(a))))
    client = gw.anthropic()

    answer = await client.messages.create(
        model="m", max_tokens=8, messages=HI, stop_sequences=["END"], extra_body={"top_k": 5}
    )
    with pytest.raises(anthropic.BadRequestError) as exc:
        await client.messages.create(
            model="m",
            max_tokens=8,
            messages=HI,
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )

    assert answer.content[0].type == "text" and answer.content[0].text == "Hello from a."
    sent = a.requests[0].json
    assert "top_k" not in sent and sent["stop"] == ["END"] and sent["max_tokens"] == 8
    assert error_body(exc.value)["error"]["type"] == "invalid_request_error"
    assert "web_search" in exc.value.message and len(a.requests) == 1


async def test_embeddings_fail_over_and_pass_the_sdk_default_base64_encoding_through(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(
        config(
            model("e", route(a, 1), route(b, 1e-6)),
            model("an", anthropic_route(a)),
            circuit=PATIENT,
        )
    )
    a.set_default(Reply(503), path="/v1/embeddings")
    client = gw.openai()

    raw = await client.embeddings.with_raw_response.create(model="e", input=["one", "two"])
    as_float = await client.embeddings.create(
        model="e", input=["one", "two"], encoding_format="float"
    )
    with pytest.raises(openai.BadRequestError) as exc:
        await client.embeddings.create(model="an", input="x")

    decoded = raw.parse()
    assert raw.headers["x-routed-via"] == eid("e", b) and decoded.model == "e"
    assert [r.json["encoding_format"] for r in b.requests] == ["base64", "float"]
    assert [len(d.embedding) for d in decoded.data] == [8, 8]
    for got, want in zip(decoded.data, as_float.data, strict=True):
        assert all(
            math.isclose(x, y, rel_tol=1e-6)
            for x, y in zip(got.embedding, want.embedding, strict=True)
        )
    assert "no embeddings API" in exc.value.message


async def test_embeddings_with_an_unknown_encoding_format_are_a_400_naming_it(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    # Relayed, the upstream answered floats (or its own error): the SDK, told "float" was
    # not asked for, could not decode what came back.
    up = await fake_upstreams("a")
    gw = await gateway_factory(config(model("e", route(up))))

    with pytest.raises(openai.BadRequestError) as exc:
        await gw.openai().embeddings.create(
            model="e",
            input="x",
            encoding_format="int8",
        )

    assert error_body(exc.value)["param"] == "encoding_format"
    assert error_body(exc.value)["type"] == "invalid_request_error"
    assert "'float' or 'base64'" in exc.value.message
    assert up.requests == []


async def test_echo_demo_upstream_answers_every_surface_plain_and_streamed(
    gateway_factory: GatewayFactory,
) -> None:
    demo = importlib.resources.files("gateway").joinpath("demo.yaml").read_text()
    gw = await gateway_factory(demo)
    oa, an = gw.openai(), gw.anthropic()

    response = await oa.responses.create(model="demo", input="ping pong")
    async with oa.responses.stream(model="demo", input="ping pong") as rs:
        streamed_response = await rs.get_final_response()
    message = await an.messages.create(
        model="demo", max_tokens=8, messages=[{"role": "user", "content": "ping pong"}]
    )
    async with an.messages.stream(
        model="demo", max_tokens=8, messages=[{"role": "user", "content": "ping pong"}]
    ) as ms:
        streamed_message = await ms.get_final_message()
    vectors = await oa.embeddings.create(model="demo", input="ping")

    assert response.output_text == streamed_response.output_text == "echo: ping pong"
    for m in (message, streamed_message):
        assert m.content[0].type == "text" and m.content[0].text == "echo: ping pong"
        assert m.stop_reason == "end_turn" and m.model == "demo"
    assert len(vectors.data[0].embedding) == 8


async def test_anthropic_base_url_with_v1_and_error_events_before_and_after_content(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(
        config(
            model("m", anthropic_route(a, 1, base_url=a.base_url + "/v1/"), route(b, 1e-6)),
            circuit=PATIENT,
        )
    )
    a.enqueue(
        Reply(body=_sse(_START, _OVERLOADED), headers=_SSE),
        Reply(body=_sse(_START, *_TEXT, _OVERLOADED), headers=_SSE),
    )
    client = gw.openai()

    # An error before any content: nothing reached the client, so the next route serves.
    first = await client.chat.completions.with_raw_response.create(
        model="m", messages=HI, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in first.parse() if c.choices])
    # After content the stream is committed: the client gets the error, never a finish.
    second = await client.chat.completions.create(model="m", messages=HI, stream=True)
    got: list[str] = []
    with pytest.raises(openai.APIError) as exc:
        async for chunk in second:
            got.extend(c.delta.content or "" for c in chunk.choices if not c.finish_reason)

    assert [r.path for r in a.requests] == ["/v1/messages"] * 2
    assert (first.headers["x-routed-via"], text) == (eid("m", b), "Hello from b.")
    assert "".join(got) == "partial" and "busy" in exc.value.message
    assert len(b.requests) == 1
