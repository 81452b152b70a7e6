"""Chat completions through the gateway with the official openai SDK: relay, routing, fallback,
and the introspection endpoints. Runs on ``inproc://`` and on NATS (``bus_url``)."""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from importlib import resources
from typing import TYPE_CHECKING, Any

import openai
import pytest

from tests.e2e.conftest import CHAT, HI, chat, config, eid, model, route
from tests.fixtures.upstream import FakeUpstream, Reply, Reset, Stream, UpstreamFactory

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

# A complete upstream answer with vendor extras: everything but ``model`` must pass unchanged.
UPSTREAM_ANSWER: dict[str, Any] = {
    "id": "chatcmpl-relay-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "up-internal-name",
    "system_fingerprint": "fp_fake",
    "service_tier": "default",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "relayed as is",
                "refusal": None,
                "annotations": [],
            },
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {
        "prompt_tokens": 7,
        "completion_tokens": 3,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 2},
    },
    "x_vendor": {"region": "loopback", "n": [1, 2, 3]},
}


async def test_demo_config_serves_model_demo_on_echo_with_and_without_stream(
    gateway_factory: GatewayFactory,
) -> None:
    demo = resources.files("gateway").joinpath("demo.yaml").read_text()
    gw = await gateway_factory(demo)
    client = gw.openai()

    answer = await client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "ping pong"}]
    )
    assert answer.model == "demo"
    assert answer.choices[0].message.content == "echo: ping pong"

    stream = await client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "ping pong"}], stream=True
    )
    pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(pieces) == "echo: ping pong"


async def test_chat_non_streaming_relays_upstream_answer_unchanged_but_model(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    fake_upstream.enqueue(Reply(body=UPSTREAM_ANSWER))
    gw = await gateway_factory(config(model("m", route(fake_upstream))))

    resp = await gw.http().post(CHAT, json=chat("m", temperature=0.2, max_tokens=9))

    assert resp.status_code == 200, resp.text
    assert resp.json() == {**UPSTREAM_ANSWER, "model": "m"}
    assert resp.headers["x-routed-via"] == eid("m", fake_upstream)
    sent = fake_upstream.requests[-1].json
    assert sent == {"model": "up1-model", "messages": HI, "temperature": 0.2, "max_tokens": 9}


async def test_chat_non_streaming_via_sdk_reports_requested_model_and_routed_endpoint(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    gw = await gateway_factory(config(model("m", route(fake_upstream))))

    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)

    answer = raw.parse()
    assert answer.model == "m"
    assert answer.choices[0].message.content == "Hello from up1."
    assert answer.usage is not None and answer.usage.total_tokens == 15
    assert raw.headers["x-routed-via"] == eid("m", fake_upstream)


async def test_chat_asked_by_alias_answers_with_the_alias_as_model(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    gw = await gateway_factory(config(model("m", route(fake_upstream), aliases=["m-alias"])))
    client = gw.openai()

    answer = await client.chat.completions.create(model="m-alias", messages=HI)
    stream = await client.chat.completions.create(model="m-alias", messages=HI, stream=True)
    models = {chunk.model async for chunk in stream}

    assert answer.model == "m-alias"
    assert models == {"m-alias"}
    assert [r.model for r in fake_upstream.requests] == ["up1-model", "up1-model"]


async def test_chat_streaming_relays_chunks_and_ends_with_done(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    fake_upstream.chunks = 4
    gw = await gateway_factory(config(model("m", route(fake_upstream))))

    async with gw.http().stream("POST", CHAT, json=chat("m", stream=True)) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["x-routed-via"] == eid("m", fake_upstream)
        body = (await resp.aread()).decode()
    frames = [f for f in body.split("\n\n") if f]
    assert frames[-1] == "data: [DONE]"
    assert all(f.startswith("data: ") for f in frames)

    stream = await gw.openai().chat.completions.create(
        model="m", messages=HI, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello from up1."
    assert {c.model for c in chunks} == {"m"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    assert fake_upstream.requests[-1].stream


async def test_chat_streaming_relays_upstream_chunks_unchanged_but_model(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    base = {
        "id": "chatcmpl-relay-2",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "up-internal-name",
        "system_fingerprint": "fp_fake",
    }
    chunks: list[dict[str, Any]] = [
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        },
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "relayed"},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
            "x_vendor": {"n": 1},
        },
        {**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]},
        {
            **base,
            "choices": [],
            "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
        },
    ]
    sse = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    fake_upstream.enqueue(Reply(body=sse, headers={"content-type": "text/event-stream"}))
    gw = await gateway_factory(config(model("m", route(fake_upstream))))

    asked = chat("m", stream=True, stream_options={"include_usage": True})
    async with gw.http().stream("POST", CHAT, json=asked) as resp:
        body = (await resp.aread()).decode()

    frames = [f.removeprefix("data: ") for f in body.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    assert [json.loads(f) for f in frames[:-1]] == [{**c, "model": "m"} for c in chunks]


async def test_models_lists_published_ids_in_openai_shape_without_aliases(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    gw = await gateway_factory(
        config(
            model("m", route(fake_upstream), aliases=["m-alias"]),
            model("hidden", route(fake_upstream), published=False),
            model("demo", {"kind": "echo"}),
        )
    )

    page = await gw.openai().models.list()
    raw = (await gw.http().get("/v1/models")).json()

    assert [m.id for m in page.data] == [
        "m",
        "demo",
        "auto",
        "auto:smartest",
        "auto:fastest",
        "auto:cheapest",
        "auto:reliable",
    ]
    assert raw["object"] == "list"
    assert all(
        m["object"] == "model" and isinstance(m["created"], int) and m["owned_by"]
        for m in raw["data"]
    )


async def test_health_endpoints_report_routes_and_per_endpoint_circuits(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(
        config(
            model("m", route(a, 3), route(b, 1)),
            model("demo", {"kind": "echo"}),
        )
    )
    http = gw.http()

    health = (await http.get("/health")).json()
    deep = (await http.get("/health/deep")).json()

    assert health["status"] == "ok" and health["routes_configured"] == 3
    endpoints = deep["endpoints"]
    assert set(endpoints) == {eid("m", a), eid("m", b), "demo:echo"}
    for state in endpoints.values():
        assert state["availability"] == 1.0
        assert state["circuit_state"] == "closed"


async def test_routing_reports_each_route_endpoint_kind_and_weight(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(
        config(
            model("m", route(a, 3), route(b, 0)),
            model("demo", {"kind": "echo"}),
        )
    )

    routing = (await gw.http().get("/routing")).json()["models"]

    assert [(r["endpoint"], r["provider"], r["weight"]) for r in routing["m"]["routes"]] == [
        (eid("m", a), "openai_compat", 3.0),
        (eid("m", b), "openai_compat", 0.0),
    ]
    assert [(r["endpoint"], r["provider"], r["weight"]) for r in routing["demo"]["routes"]] == [
        ("demo:echo", "echo", 1.0)
    ]


async def test_weighted_draw_splits_3_to_1_and_never_picks_weight_zero(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, zero = await fake_upstreams("a"), await fake_upstreams("b"), await fake_upstreams("z")
    # One client is one caller: without the affinity kill switch every request would follow
    # the first draw's pin. Learned capacity off: on a loaded machine the fake upstreams do
    # queue 12 requests at `a`, and spilling them to `b` would be right, but this test checks
    # the draw alone.
    gw = await gateway_factory(
        config(
            model("m", route(a, 3), route(b, 1), route(zero, 0)),
            routing={"affinity": {"enabled": False}, "learned_capacity": {"enabled": False}},
        )
    )
    client = gw.openai()
    n, p = 400, 0.75
    gate = asyncio.Semaphore(16)

    async def one() -> str:
        async with gate:
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
            return str(raw.headers["x-routed-via"])

    via = Counter(await asyncio.gather(*(one() for _ in range(n))))

    sigma = math.sqrt(n * p * (1 - p))  # ~8.7; 4 sigma fails once in ~16,000 runs
    assert abs(via[eid("m", a)] - n * p) <= 4 * sigma, via
    assert via[eid("m", a)] + via[eid("m", b)] == n, via
    assert (len(a.requests), len(b.requests), len(zero.requests)) == (
        via[eid("m", a)],
        via[eid("m", b)],
        0,
    )


async def test_fallback_walks_remaining_routes_in_declaration_order(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c, d = [await fake_upstreams(n) for n in "abcd"]
    # ``a`` is the primary but for odds of ~1e-5; ``c`` outweighs ``b`` but is declared later.
    gw = await gateway_factory(
        config(
            model("m", route(a, 1), route(b, 1e-6), route(d, 0), route(c, 1e-5)),
            circuit={"failure_threshold": 5, "cooldown_seconds": 30},
        )
    )
    a.enqueue(Reply(500))
    b.enqueue(Reset())
    for up in (a, b, c, d):
        up.text = f"served by {up.name}"

    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)

    arrivals = sorted((r.t, up.name) for up in (a, b, c, d) for r in up.requests)
    assert [name for _, name in arrivals] == ["a", "b", "c"]
    assert raw.headers["x-routed-via"] == eid("m", c)
    assert raw.parse().choices[0].message.content == "served by c"


async def test_fallback_when_every_route_fails_answers_the_primary_error(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(
        config(
            model("m", route(a, 1), route(b, 1e-6)),
            circuit={"failure_threshold": 5, "cooldown_seconds": 30},
        )
    )
    a.enqueue(Reply(503, body={"error": {"message": "alpha is overloaded"}}))
    b.enqueue(Reply(500, body={"error": {"message": "beta is broken"}}))

    with pytest.raises(openai.APIStatusError) as exc:
        await gw.openai().chat.completions.create(model="m", messages=HI)

    assert exc.value.status_code == 502
    assert "alpha is overloaded" in exc.value.message
    assert (len(a.requests), len(b.requests)) == (1, 1)


async def test_stream_when_every_route_fails_before_first_byte_answers_the_primary_error(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(
        config(
            model("m", route(a, 1), route(b, 1e-6)),
            circuit={"failure_threshold": 5, "cooldown_seconds": 30},
        )
    )
    a.enqueue(Reply(503, body={"error": {"message": "alpha is overloaded"}}))
    b.enqueue(Reset())

    with pytest.raises(openai.APIStatusError) as exc:
        await gw.openai().chat.completions.create(model="m", messages=HI, stream=True)

    assert exc.value.status_code == 502
    assert exc.value.response.headers["content-type"].startswith("application/json")
    assert "alpha is overloaded" in exc.value.message
    assert (len(a.requests), len(b.requests)) == (1, 1)


async def test_stream_failing_before_first_byte_falls_back_and_names_the_server(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(config(model("m", route(a, 1), route(b, 1e-6))))
    a.enqueue(Reply(500))

    raw = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=HI, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])

    # The headers went out only once ``b`` committed, so they name ``b``.
    assert raw.headers["x-routed-via"] == eid("m", b)
    assert text == "Hello from b."
    assert (len(a.requests), len(b.requests)) == (1, 1)


async def test_stream_cut_after_first_chunk_never_falls_back_and_ends_in_error_event(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(config(model("m", route(a, 1), route(b, 1e-6))))
    a.enqueue(Stream(cut_after=1), Stream(cut_after=1))

    stream = await gw.openai().chat.completions.create(model="m", messages=HI, stream=True)
    got: list[str] = []
    with pytest.raises(openai.APIError) as exc:
        async for chunk in stream:
            got.extend(c.delta.content or "" for c in chunk.choices)

    assert got and "Hello from a.".startswith("".join(got)) and "".join(got) != "Hello from a."
    assert "upstream stream broke" in exc.value.message
    async with gw.http().stream("POST", CHAT, json=chat("m", stream=True)) as resp:
        body = (await resp.aread()).decode()
    frames = [f for f in body.split("\n\n") if f]
    assert '"error"' in frames[-1]
    assert "[DONE]" not in body
    assert (len(a.requests), len(b.requests)) == (2, 0)
