"""Failure semantics through the real server with the openai SDK: context windows (a prompt
that cannot fit is never sent; a context-length refusal rules out every remaining route no
wider), what fallback skips, which error a client sees when every route failed, upstream auth
rejections (401/407) on /health/deep, and routing attribution reaching the observations but
never the client's body. Runs on ``inproc://`` and on NATS (``bus_url``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import openai
import pytest

from schemas import AuthRejected, Observation, subjects
from tests.e2e.conftest import (
    CHAT,
    HI,
    WAIT,
    assert_openai_error,
    chat,
    circuit_events,
    config,
    eid,
    model,
    route,
    watch,
)
from tests.fixtures.upstream import FakeUpstream, Reply, UpstreamFactory

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

T = TypeVar("T")
ADMIN = "adm-failures"
# Neither a circuit nor the model bench takes a route out by accident.
PATIENT = {"failure_threshold": 100, "cooldown_seconds": 30}
NO_BENCH = {"bench": {"failures": 100}}
BIG: list[Any] = [{"role": "user", "content": "x" * 4000}]  # ~1000 tokens as estimated
IMAGE: list[Any] = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        ],
    }
]


async def _eventually(ask: Callable[[], Awaitable[T]], ok: Callable[[T], bool]) -> T:
    """Ask the gateway again until its answer satisfies ``ok`` (views update by events)."""
    with anyio.fail_after(WAIT):
        while not ok(answer := await ask()):
            pass
    return answer


def _refusal(message: str, code: str | None = None) -> Reply:
    return Reply(
        400, body={"error": {"message": message, "type": "invalid_request_error", "code": code}}
    )


# -- context windows ---------------------------------------------------------------------------


async def test_prompt_that_cannot_fit_a_routes_context_window_is_never_sent_there(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    small, wide = await fake_upstreams("small"), await fake_upstreams("wide")
    gw = await gateway_factory(
        config(
            model(
                "m", route(small, 1e6, context_window=500), route(wide, 1e-6, context_window=8000)
            ),
            routing={"affinity": {"enabled": False}},
        )
    )
    client = gw.openai()

    big = await client.chat.completions.with_raw_response.create(model="m", messages=BIG)
    short = await client.chat.completions.with_raw_response.create(model="m", messages=HI)

    assert big.headers["x-routed-via"] == eid("m", wide)
    assert short.headers["x-routed-via"] == eid("m", small)
    assert (len(small.requests), len(wide.requests)) == (1, 1)


async def test_prompt_fitting_no_routes_context_window_is_400_and_sends_nothing(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(
        config(model("m", route(a, context_window=300), route(b, context_window=500)))
    )

    with pytest.raises(openai.BadRequestError) as exc:
        await gw.openai().chat.completions.create(model="m", messages=BIG, stream=True)

    err = assert_openai_error(exc.value.response, 400, "invalid_request")
    assert "context window" in err["message"] and "500" in err["message"]
    assert (len(a.requests), len(b.requests)) == (0, 0)


CONTEXT_REFUSALS = {
    "openai_code": _refusal(
        "This model's maximum context length is 8000 tokens.", "context_length_exceeded"
    ),
    "message_only": _refusal("prompt is too long: 9100 tokens > 8000 maximum"),
}


@pytest.mark.parametrize("refusal", CONTEXT_REFUSALS.values(), ids=CONTEXT_REFUSALS.keys())
async def test_context_length_refusal_skips_every_remaining_route_no_wider(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    refusal: Reply,
) -> None:
    first, narrower, same, wider = [
        await fake_upstreams(n) for n in ("first", "narrower", "same", "wider")
    ]
    gw = await gateway_factory(
        config(
            model(
                "m",
                route(first, 1, context_window=8000),
                route(narrower, 1e-9, context_window=4000),
                route(same, 1e-9, context_window=8000),
                route(wider, 1e-9, context_window=16000),
            ),
            circuit=PATIENT,
        )
    )
    first.enqueue(refusal, refusal)
    wider.enqueue(
        _refusal("This model's maximum context length is 16000 tokens.", "context_length_exceeded")
    )

    with pytest.raises(openai.BadRequestError) as refused:  # the prompt fits nowhere
        await gw.openai().chat.completions.create(model="m", messages=HI)
    served = await gw.openai().chat.completions.with_raw_response.create(
        model="m", messages=HI
    )  # only first refuses this time: wider serves

    assert "8000" in refused.value.message  # the primary's refusal
    assert served.headers["x-routed-via"] == eid("m", wider)
    assert (len(narrower.requests), len(same.requests)) == (0, 0)
    assert (len(first.requests), len(wider.requests)) == (2, 2)


async def test_plain_400_falls_back_to_every_remaining_route_whatever_its_window(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    first, narrower = await fake_upstreams("first"), await fake_upstreams("narrower")
    gw = await gateway_factory(
        config(
            model(
                "m",
                route(first, 1, context_window=8000),
                route(narrower, 1e-9, context_window=4000),
            )
        )
    )
    first.enqueue(_refusal("temperature must be at most 2"))

    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)

    assert raw.headers["x-routed-via"] == eid("m", narrower)


# -- what fallback skips -----------------------------------------------------------------------


async def test_fallback_skips_open_circuits_and_routes_that_cannot_take_the_modality(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, opened, text, d = [await fake_upstreams(n) for n in ("a", "opened", "text", "d")]
    vision = {"input_modalities": ["text", "image"]}
    gw = await gateway_factory(
        config(
            model(
                "m",
                route(a, 1, **vision),
                route(opened, 1e-9, **vision),
                route(text, 1e-9),
                route(d, 1e-9, **vision),
            ),
            circuit={"failure_threshold": 1, "cooldown_seconds": 30},
            admin_key=ADMIN,
        )
    )
    opened.enqueue(Reply(500))
    async with circuit_events(gw) as events:
        await gw.http().post(
            CHAT,
            json=chat("m"),
            headers={"authorization": f"Bearer {ADMIN}", "x-route-pin": eid("m", opened)},
        )
        await events.circuit("open", eid("m", opened))
    a.enqueue(Reply(500))

    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=IMAGE)

    assert raw.headers["x-routed-via"] == eid("m", d)
    assert (len(a.requests), len(opened.requests), len(text.requests)) == (1, 1, 0)


# -- which error the client sees ---------------------------------------------------------------


def _failing(status: int, who: str) -> Reply:
    return Reply(status, body={"error": {"message": f"{who} says {status}"}})


# (primary's status, the fallback's status) -> (status the client gets, whose message)
SURFACED = {
    "later_400_wins_over_500": ((500, 400), (400, "fallback")),
    "later_404_wins_over_503": ((503, 404), (404, "fallback")),
    "later_413_wins_over_500": ((500, 413), (413, "fallback")),
    "later_422_wins_over_429": ((429, 422), (422, "fallback")),
    "later_429_stays_hidden": ((500, 429), (502, "primary")),
    "later_concurrency_403_stays_hidden": ((503, 403), (502, "primary")),
    "primary_429_over_later_500": ((429, 500), (429, "primary")),
    "primary_400_over_later_422": ((400, 422), (400, "primary")),
    "primary_401_over_later_500": ((401, 500), (502, "primary")),
}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_error_shown_when_every_route_fails_is_the_primarys_unless_a_later_one_describes_the_request(  # noqa: E501
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    stream: bool,
) -> None:
    primary, fallback = await fake_upstreams("primary"), await fake_upstreams("fallback")
    # A model per case: a 429 cools its route's key, and a route back from cooling is tried
    # first, so a case on the same routes after one with a 429 would meet them in another order.
    models = [model(case, route(primary, 1), route(fallback, 1e-9)) for case in SURFACED]
    gw = await gateway_factory(config(*models, circuit=PATIENT, routing=NO_BENCH))
    client = gw.http()

    for case, ((first, second), (status, whose)) in SURFACED.items():
        primary.enqueue(_failing(first, "primary"))
        fallback.enqueue(_failing(second, "fallback"))
        resp = await client.post(CHAT, json=chat(case, stream=stream))
        err = assert_openai_error(resp, status)
        assert f"{whose} says" in err["message"], (case, err)
    assert len(primary.requests) == len(fallback.requests) == len(SURFACED)


async def test_error_shown_does_not_depend_on_which_route_the_draw_picked_first(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    strict, broken = await fake_upstreams("strict"), await fake_upstreams("broken")
    strict.set_default(_refusal("your tool arguments are invalid"))
    broken.set_default(Reply(500))
    gw = await gateway_factory(
        config(
            model("m", route(strict), route(broken)),
            circuit=PATIENT,
            routing={"affinity": {"enabled": False}, **NO_BENCH},
        )
    )

    async with watch(gw, subjects.observation(eid("m", strict))) as attempts:
        answers = [await gw.http().post(CHAT, json=chat("m")) for _ in range(30)]
        seen = [await attempts.next(Observation) for _ in range(30)]

    for resp in answers:
        err = assert_openai_error(resp, 400)
        assert "your tool arguments are invalid" in err["message"]
    # Both orders happened (all alike: 1 in 500 million).
    assert {o.attempt for o in seen} == {1, 2}


# -- upstream auth rejections ------------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 407])
async def test_upstream_auth_rejection_counts_from_the_first_one_on_health_deep_with_a_warning(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    caplog: pytest.LogCaptureFixture,
    status: int,
) -> None:
    caplog.set_level(logging.WARNING, logger="actors.endpoint")
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    a.set_default(Reply(status))
    gw = await gateway_factory(
        config(
            model("m", route(a, 1), route(b, 1e-9)),
            circuit={"failure_threshold": 2, "cooldown_seconds": 30},
        )
    )
    bad = eid("m", a)

    async def deep() -> dict[str, Any]:
        return dict((await gw.http().get("/health/deep")).json())

    async with watch(gw, subjects.event("auth_rejected")) as rejections:
        served = await gw.http().post(CHAT, json=chat("m"))
        first = await rejections.next(AuthRejected)
        after_one = await _eventually(
            deep, lambda d: d["endpoints"][bad]["consecutive_auth_rejections"] == 1
        )
        async with circuit_events(gw) as events:
            await gw.http().post(CHAT, json=chat("m"))
            await events.circuit("open", bad)
        opened = await _eventually(deep, lambda d: d["endpoints"][bad]["circuit_state"] == "open")

    assert served.status_code == 200 and served.headers["x-routed-via"] == eid("m", b)
    assert (first.endpoint, first.status, first.consecutive) == (bad, status, 1)
    assert after_one["status"] == "degraded"
    assert after_one["endpoints"][bad]["circuit_state"] == "closed"
    assert not after_one["endpoints"][bad]["healthy"]
    assert after_one["endpoints"][eid("m", b)]["consecutive_auth_rejections"] == 0
    assert opened["status"] == "degraded"
    assert opened["endpoints"][bad]["consecutive_auth_rejections"] == 2
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "credential" in r.getMessage()
    ]
    assert warnings and bad in warnings[0] and str(status) in warnings[0]


async def test_health_deep_is_degraded_once_an_availability_falls_under_0_9(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    gw = await gateway_factory(
        config(model("m", route(fake_upstream)), circuit=PATIENT, routing=NO_BENCH)
    )
    endpoint = eid("m", fake_upstream)
    fake_upstream.set_default(Reply(500))

    async def deep() -> dict[str, Any]:
        return dict((await gw.http().get("/health/deep")).json())

    await gw.http().post(CHAT, json=chat("m"))
    at_floor = await _eventually(deep, lambda d: d["endpoints"][endpoint]["availability"] < 1)
    await gw.http().post(CHAT, json=chat("m"))
    under = await _eventually(deep, lambda d: d["endpoints"][endpoint]["availability"] < 0.9)

    assert (at_floor["status"], at_floor["endpoints"][endpoint]["availability"]) == (
        "ok",
        pytest.approx(0.9),
    )
    assert (under["status"], under["endpoints"][endpoint]["circuit_state"]) == (
        "degraded",
        "closed",
    )


# -- attribution stays internal ----------------------------------------------------------------

_INTERNAL = ("_routing", "failed_attempts", "endpoint_id", "base_url", "provider")


def _assert_no_attribution(text: str, *ups: Any) -> None:
    for word in (*_INTERNAL, *(up.base_url for up in ups), *(f"local-{up.port}" for up in ups)):
        assert word not in text, (word, text)


async def test_fallback_attribution_reaches_the_observations_never_the_clients_body(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    gw = await gateway_factory(config(model("m", route(a, 1), route(b, 1e-9)), circuit=PATIENT))
    a.enqueue(Reply(500), Reply(500))

    async with watch(gw, subjects.OBSERVATION_ANY) as observations:
        plain = await gw.http().post(CHAT, json=chat("m"))
        async with gw.http().stream("POST", CHAT, json=chat("m", stream=True)) as resp:
            streamed = (await resp.aread()).decode()
        seen = [await observations.next(Observation) for _ in range(4)]

    assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"] == (
        "Hello from b."
    )
    assert "Hello" in streamed and streamed.rstrip().endswith("data: [DONE]")
    _assert_no_attribution(plain.text, a, b)
    _assert_no_attribution(streamed, a, b)
    assert [(o.endpoint, o.attempt, o.fallback, o.outcome, o.status) for o in seen] == [
        (eid("m", a), 1, False, "failure", 500),
        (eid("m", b), 2, True, "success", 200),
    ] * 2
    assert [o.stream for o in seen] == [False, False, True, True]
    assert len({o.request_id for o in seen}) == 2
