"""Selection through the real server with the openai SDK, in the spec's order: the modality
filter, the admin-only ``X-Route-Pin``, weight and circuit admission (a 1000-request weighted
split; one half-open probe under a concurrent burst, never wedged by a probe that hangs or is
abandoned), and strategies chosen in the config (``round_robin``; unknown names and params fail
at startup). Runs on ``inproc://`` and on NATS (``bus_url``)."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import TYPE_CHECKING, Any

import anthropic
import openai
import pytest
import yaml

from gateway.cli import main as cli
from schemas import CircuitTransition
from tests.e2e.conftest import (
    CHAT,
    FAST_CIRCUIT,
    HALF_OPEN_SOON,
    HI,
    STAYS_OPEN,
    WAIT,
    assert_openai_error,
    chat,
    circuit_events,
    config,
    eid,
    model,
    route,
)
from tests.fixtures.upstream import FakeUpstream, Hang, Reply, UpstreamFactory

if TYPE_CHECKING:
    from pathlib import Path

    import httpx

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

ADMIN = "adm-selection"
NO_AFFINITY = {"affinity": {"enabled": False}}
IMAGE: list[Any] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        ],
    }
]


async def _via(client: openai.AsyncOpenAI, **kw: Any) -> str:
    """The endpoint that served one chat completion (its ``x-routed-via``)."""
    raw = await client.chat.completions.with_raw_response.create(
        model=kw.pop("model", "m"), messages=kw.pop("messages", HI), **kw
    )
    return str(raw.headers["x-routed-via"])


# -- 1. a published, non-empty route ---------------------------------------------------------


async def test_model_unpublished_or_without_routes_is_404_and_unlisted(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    gw = await gateway_factory(
        config(
            model("m", route(fake_upstream)),
            model("hidden", route(fake_upstream), published=False),
            model("empty"),
        )
    )
    client = gw.openai()

    for name in ("hidden", "empty"):
        with pytest.raises(openai.NotFoundError) as exc:
            await client.chat.completions.create(model=name, messages=HI)
        assert_openai_error(exc.value.response, 404, "route_not_found")
    listed = [m.id async for m in client.models.list()]

    assert "hidden" not in listed
    assert len(fake_upstream.requests) == 0


# -- 2. the modality filter ------------------------------------------------------------------


async def test_image_request_goes_only_to_a_route_whose_modalities_cover_it(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    text_only, vision = await fake_upstreams("text"), await fake_upstreams("vision")
    gw = await gateway_factory(
        config(
            model(
                "m", route(text_only, 1e6), route(vision, 1e-6, input_modalities=["text", "image"])
            ),
            routing=NO_AFFINITY,
        )
    )
    client = gw.openai()

    images = [await _via(client, messages=IMAGE) for _ in range(3)]
    texts = [await _via(client) for _ in range(3)]

    assert images == [eid("m", vision)] * 3
    assert texts == [eid("m", text_only)] * 3
    assert all(r.json["messages"][0]["content"][1]["type"] == "image_url" for r in vision.requests)


async def test_image_request_no_route_accepts_is_400_naming_the_modality_and_sends_nothing(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    # A deliberate change from the spec's AllCircuitsOpenError (503): no route of the model
    # can ever take this request, so a retry is in vain; the caller must change it.
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(config(model("m", route(a), route(b, input_modalities=["text"]))))

    with pytest.raises(openai.BadRequestError) as plain:
        await gw.openai().chat.completions.create(model="m", messages=IMAGE)
    with pytest.raises(openai.BadRequestError) as streamed:
        await gw.openai().chat.completions.create(model="m", messages=IMAGE, stream=True)
    with pytest.raises(anthropic.BadRequestError) as messages:
        await gw.anthropic().messages.create(
            model="m",
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is in this picture?"},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": "iVBORw0KGgo=",
                            },
                        },
                    ],
                },
            ],
        )

    for exc in (plain, streamed):
        err = assert_openai_error(exc.value.response, 400, "no_route_for_modality")
        assert "image" in err["message"]
        assert "retry-after" not in exc.value.response.headers
    body = messages.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "image" in body["error"]["message"]
    assert "retry-after" not in messages.value.response.headers
    assert (len(a.requests), len(b.requests)) == (0, 0)


# -- 3. the explicit pin ---------------------------------------------------------------------


@pytest.mark.parametrize("source", ["config", "env"])
async def test_admin_pin_selects_its_route_through_an_open_circuit_and_never_falls_back(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    monkeypatch: pytest.MonkeyPatch,
    source: str,
) -> None:
    if source == "env":
        monkeypatch.setenv("LLMGW_ADMIN_KEY", ADMIN)
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    admin_key: dict[str, Any] = {"admin_key": ADMIN} if source == "config" else {}
    gw = await gateway_factory(
        config(
            model("m", route(a, 1), route(b, 1e-9)),
            circuit={"failure_threshold": 1, "cooldown_seconds": 30},
            **admin_key,
        )
    )
    admin = gw.openai(api_key=ADMIN)
    pin = {"X-Route-Pin": eid("m", b)}
    b.enqueue(Reply(500, body={"error": {"message": "beta is down"}}))

    async with circuit_events(gw) as events:
        with pytest.raises(openai.APIStatusError) as failed:
            await admin.chat.completions.create(model="m", messages=HI, extra_headers=pin)
        await events.circuit("open", eid("m", b))
    through_open = await _via(admin, extra_headers=pin)
    streamed = await admin.chat.completions.with_raw_response.create(
        model="m", messages=HI, stream=True, extra_headers=pin
    )
    text = "".join([c.choices[0].delta.content or "" async for c in streamed.parse() if c.choices])
    unpinned = await _via(admin)

    assert failed.value.status_code == 502 and "beta is down" in failed.value.message
    assert through_open == eid("m", b)
    assert streamed.headers["x-routed-via"] == eid("m", b) and text == "Hello from b."
    assert unpinned == eid("m", a)  # b's circuit is open to everyone else
    assert (len(a.requests), len(b.requests)) == (1, 3)  # the pinned failure never fell back


def _raw_header(resp: httpx.Response, name: bytes) -> bytes:
    """A response header's bytes as sent (httpx's ``headers`` reads them as latin-1)."""
    return next(value for key, value in resp.headers.raw if key.lower() == name)


async def test_admin_pin_names_a_route_of_a_model_whose_id_is_not_ascii(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(
        config(model("modèle", route(a, 1), route(b, 1e-9)), admin_key=ADMIN)
    )
    admin = {b"authorization": f"Bearer {ADMIN}".encode()}

    first = await gw.http().post(CHAT, json=chat("modèle"), headers=admin)
    # An admin pins the route it was shown, sending back the UTF-8 bytes it came in.
    pin = eid("modèle", b).encode()
    pinned = await gw.http().post(CHAT, json=chat("modèle"), headers={**admin, b"x-route-pin": pin})

    assert _raw_header(first, b"x-routed-via") == eid("modèle", a).encode()
    assert pinned.status_code == 200, pinned.text
    assert _raw_header(pinned, b"x-routed-via") == pin
    assert len(b.requests) == 1


async def test_pin_from_a_non_admin_caller_is_ignored(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(config(model("m", route(a, 1), route(b, 1e-9)), admin_key=ADMIN))
    client = gw.openai(api_key="sk-not-the-admin")

    pinned = await _via(client, extra_headers={"X-Route-Pin": eid("m", b)})
    unknown = await _via(client, extra_headers={"X-Route-Pin": "m:nowhere"})

    assert (pinned, unknown) == (eid("m", a), eid("m", a))
    assert len(b.requests) == 0


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_admin_pin_matching_no_route_is_400_before_any_byte_is_streamed(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    stream: bool,
) -> None:
    a = await fake_upstreams("a")
    other = await fake_upstreams("other")
    gw = await gateway_factory(
        config(model("m", route(a)), model("n", route(other)), admin_key=ADMIN)
    )
    headers = {"authorization": f"Bearer {ADMIN}"}

    answers = [
        await gw.http().post(
            CHAT, json=chat("m", stream=stream), headers={**headers, "x-route-pin": pin}
        )
        for pin in ("m:nowhere", eid("n", other))  # nothing, or another model's endpoint
    ]

    for resp in answers:
        err = assert_openai_error(resp, 400, "pin_not_found")
        assert "X-Route-Pin" in err["message"]
    assert (len(a.requests), len(other.requests)) == (0, 0)


# -- 4. weight and circuit admission ---------------------------------------------------------


async def test_weighted_draw_over_1000_requests_splits_5_3_2_within_4_5_sigma(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c, zero = [await fake_upstreams(n) for n in ("a", "b", "c", "zero")]
    # Learned capacity off: 32 in flight put 16 at `a`, where slow start spills (and on a
    # loaded machine the fake upstreams do queue); this checks the draw alone.
    gw = await gateway_factory(
        config(
            model("m", route(a, 5), route(zero, 0), route(b, 3), route(c, 2)),
            routing={**NO_AFFINITY, "learned_capacity": {"enabled": False}},
        )
    )
    client = gw.openai()
    n = 1000
    gate = asyncio.Semaphore(32)

    async def one() -> str:
        async with gate:
            return await _via(client)

    via = Counter(await asyncio.gather(*(one() for _ in range(n))))

    for up, p in ((a, 0.5), (b, 0.3), (c, 0.2)):
        sigma = math.sqrt(n * p * (1 - p))
        # 4.5 sigma per route: a false failure about once in 50,000 runs.
        assert abs(via[eid("m", up)] - n * p) <= 4.5 * sigma, via
        assert len(up.requests) == via[eid("m", up)]
    assert sum(via.values()) == n and len(zero.requests) == 0


async def _until_half_open(gw: RunningGateway, up: FakeUpstream) -> None:
    """Open ``up``'s circuit with one failed request and wait until it half-opens."""
    async with circuit_events(gw) as events:
        await gw.http().post(CHAT, json=chat("m"))
        await events.circuit("open", eid("m", up))
        await events.circuit("half_open", eid("m", up))


async def _first(tasks: list[asyncio.Task[Any]], n: int) -> list[Any]:
    """The results of the first ``n`` of ``tasks`` to finish (the rest keep running)."""
    out: list[Any] = []
    for fut in asyncio.as_completed(tasks, timeout=WAIT):
        out.append(await fut)
        if len(out) == n:
            break
    return out


async def test_half_open_admits_exactly_one_of_8_concurrent_requests_and_an_abandoned_probe_is_replaced(  # noqa: E501
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    gw = await gateway_factory(
        config(model("m", route(up)), circuit={**HALF_OPEN_SOON, "failure_threshold": 1})
    )
    up.enqueue(Reply(500), Hang())
    await _until_half_open(gw, up)
    client = gw.http()

    async with circuit_events(gw) as events:
        burst = [asyncio.create_task(client.post(CHAT, json=chat("m"))) for _ in range(8)]
        refused = await _first(burst, 7)
        probe = next(t for t in burst if not t.done())
        assert len(up.requests) == 2  # the failure that opened the circuit, and one probe
        probe.cancel()  # the probe's client goes away
        reopened = await events.circuit("open", eid("m", up))
        await events.circuit("half_open", eid("m", up))
        served = await client.post(CHAT, json=chat("m"))
        closed = await events.circuit("closed", eid("m", up))

    for resp in refused:
        assert_openai_error(resp, 503, "all_circuits_open")
    assert "abandoned" in reopened.reason
    assert served.status_code == 200 and closed.reason == "probe succeeded"
    assert len(up.requests) == 3


async def test_half_open_hung_probe_is_ended_by_the_routes_timeout_and_a_new_probe_admitted(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    # The probe's deadline is the route's own timeout (plus a cooldown of grace): the ingress
    # gives up on the hung probe at that timeout and reports it, which re-opens the circuit.
    gw = await gateway_factory(
        config(
            model("m", route(up, timeout_seconds=1.0, ttft_timeout_seconds=1.0)),
            circuit={**HALF_OPEN_SOON, "failure_threshold": 1},
        )
    )
    up.enqueue(Reply(500), Hang())
    await _until_half_open(gw, up)

    async with circuit_events(gw) as events:
        hung = await gw.http().post(CHAT, json=chat("m"))
        reopened = await events.circuit("open", eid("m", up))
        await events.circuit("half_open", eid("m", up))
        served = await gw.http().post(CHAT, json=chat("m"))
        await events.circuit("closed", eid("m", up))

    assert_openai_error(hung, 504)
    assert (reopened.old, reopened.reason) == ("half_open", "probe failed")
    assert served.status_code == 200
    assert len(up.requests) == 3


async def test_half_open_probe_slower_than_the_cooldown_closes_the_circuit(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    # The model answers in 1 s, more than the 0.3 s cooldown: its probe must still count.
    gw = await gateway_factory(
        config(
            model("m", route(up, timeout_seconds=30)),
            circuit={**FAST_CIRCUIT, "failure_threshold": 1},
        )
    )
    up.enqueue(Reply(500), Reply(delay=1.0))
    await _until_half_open(gw, up)

    async with circuit_events(gw) as events:
        served = await gw.http().post(CHAT, json=chat("m"))
        closed = await events.circuit("closed", eid("m", up))

    assert served.status_code == 200
    assert (closed.old, closed.reason) == ("half_open", "probe succeeded")
    transitions = [(t.old, t.new) for t in events.seen if isinstance(t, CircuitTransition)]
    assert transitions == [("half_open", "closed")]  # never re-opened while it was answering


# -- strategies ------------------------------------------------------------------------------


async def test_round_robin_from_default_router_cycles_admissible_routes_for_one_caller(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, zero, d, x, y = [await fake_upstreams(n) for n in ("a", "b", "zero", "d", "x", "y")]
    gw = await gateway_factory(
        config(
            model("rr", route(a, 1), route(b, 5), route(zero, 0), route(d, 1)),
            model("fx", route(x, 1), route(y, 1e-9), router="fixed"),
            routing={"default_router": "round_robin"},
        )
    )
    client = gw.openai()  # one caller, affinity on (the default)

    cycled = [await _via(client, model="rr") for _ in range(6)]
    fixed = [await _via(client, model="fx") for _ in range(3)]
    routing = (await gw.http().get("/routing")).json()["models"]

    assert cycled == [eid("rr", up) for up in (a, b, d, a, b, d)]
    assert fixed == [eid("fx", x)] * 3
    assert (routing["rr"]["router"], routing["fx"]["router"]) == ("round_robin", "fixed")
    assert len(zero.requests) == 0


async def test_round_robin_skips_an_open_circuit(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b, c = [await fake_upstreams(n) for n in "abc"]
    b.set_default(Reply(500))
    gw = await gateway_factory(
        config(
            model("m", route(a), route(b), route(c), router="round_robin"),
            circuit={**STAYS_OPEN, "failure_threshold": 1},
        )
    )
    client = gw.openai()

    async with circuit_events(gw) as events:
        # a; then b, which fails over to the first remaining route in declaration order
        first = [await _via(client) for _ in range(2)]
        await events.circuit("open", eid("m", b))
    after = [await _via(client) for _ in range(4)]

    assert first == [eid("m", a), eid("m", a)]
    assert after == [eid("m", up) for up in (c, a, c, a)]
    assert len(b.requests) == 1


STARTUP_ERRORS = {
    "unknown_router": (
        {"router": "fastest"},
        "models[0].router: unknown router 'fastest'; known routers: fixed, greedy_cost, "
        "greedy_latency, round_robin",
    ),
    "unknown_default_router": (
        {"_default": "fastest"},
        "routing.default_router: unknown router 'fastest'; known routers: fixed, greedy_cost, "
        "greedy_latency, round_robin",
    ),
    "unknown_param": (
        {"router": "round_robin", "router_params": {"skip": True}},
        "models[0].router_params: router_params for 'round_robin': skip:",
    ),
    "fixed_unknown_param": (
        {"router_params": {"local_fractoin": 0.5}},
        "models[0].router_params: router_params for 'fixed': local_fractoin:",
    ),
    "routewise_resource_key": (
        {"router": "routewise", "router_params": {"daily_quota": 5}},
        "models[0].router_params: router_params for 'routewise': "
        "'daily_quota' is no longer a router_params key: set route ",
    ),
    "routewise_quota_only": (
        {
            "router": "routewise",
            "route": [
                {
                    "kind": "echo",
                    "provider_type": "quota",
                    "quota": {"limit": 5},
                    "quota_source": {"kind": "local"},
                }
            ],
        },
        "models[0]: model 'm' has only quota routes, so RouteWise cannot calibrate",
    ),
}


@pytest.mark.parametrize(("entry", "expected"), STARTUP_ERRORS.values(), ids=STARTUP_ERRORS.keys())
def test_serve_with_an_unusable_router_exits_2_at_startup_saying_what_is_known(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    entry: dict[str, Any],
    expected: str,
) -> None:
    entry = dict(entry)
    default = entry.pop("_default", None)
    cfg: dict[str, Any] = {"models": [{"id": "m", "route": [{"kind": "echo"}], **entry}]}
    if default is not None:
        cfg["routing"] = {"default_router": default}
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))

    code = cli.main(["serve", "--config", str(path), "--port", "0"])

    err = capsys.readouterr().err
    assert code == 2
    assert f"llmgw: invalid configuration: {path}: {expected}" in err, err
