"""Benching through the real server with the openai SDK: the model bench across credentials,
Retry-After as a floor (on the bench and on a credential's mute), the background probe that
lifts or re-benches, the per-model breaker, and the 503 with Retry-After when every candidate
is out.

Events are awaited on the gateway's bus (``llmgw.events.bench``, ``llmgw.events.keypool``,
``llmgw.events.model_breaker``, ``llmgw.probe.due``, endpoint states); nothing sleeps.
Circuit breakers are set never to trip, so what is proven is the bench. Runs on ``inproc://``
and on NATS.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any

import openai
import pytest

from schemas import (
    BenchChanged,
    EndpointState,
    KeyMuted,
    KeyUnmuted,
    ModelBreakerTripped,
    ProbeDue,
    subjects,
)
from schemas.config import credential_id
from tests.e2e.conftest import HI, Watch, assert_openai_error, config, eid, model, route, watch
from tests.e2e.keys_support import pool_state
from tests.fixtures.upstream import Behaviour, FakeUpstream, Hang, Reply, UpstreamFactory

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from tests.fixtures.gateway import GatewayFactory, RunningGateway

pytestmark = pytest.mark.e2e

CALM = {"failure_threshold": 100, "cooldown_seconds": 30}
TINY = 1e-6
ADMIN = "sk-admin-bench"


def bench(**settings: Any) -> dict[str, Any]:
    return {"bench": settings}


def retry_after(seconds: int) -> Reply:
    """A sick answer that says when to come back (a 429 would be back-pressure instead:
    tests/e2e/test_backpressure_openai_sdk.py)."""
    return Reply(503, headers={"Retry-After": str(seconds)})


def expected_retry_after(until: float, before: float, after: float) -> range:
    """The whole seconds a 503 answered between ``before`` and ``after`` may carry for a
    recovery at ``until`` (rounded up, as the gateway does)."""
    return range(math.ceil(until - after), math.ceil(until - before) + 1)


async def bench_event(events: Watch, endpoint: str, benched: bool = True) -> BenchChanged:
    return await events.next(
        BenchChanged, lambda e: e.endpoint == endpoint and e.benched == benched
    )


def benched_state(endpoint: str) -> Callable[[EndpointState], bool]:
    return lambda s: s.endpoint == endpoint and s.benched_until is not None


async def _fails(call: Callable[[], Awaitable[Any]]) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as err:
        await call()
    return err.value


def chat(gw: RunningGateway, **kw: Any) -> Callable[[], Awaitable[Any]]:
    client = gw.openai(**kw)
    return lambda: client.chat.completions.with_raw_response.create(model="m", messages=HI)


# -- the model bench ------------------------------------------------------------------------


async def test_bench_third_failure_across_credentials_benches_the_route_on_every_credential(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    keys = ["sk-one", "sk-two", "sk-three"]
    a.enqueue(Reply(500), Reply(503), Reply(502))
    a.set_default(Reply(500))  # still sick: the muted keys' probes fail and lift nothing
    gw = await gateway_factory(
        config(
            model("m", route(a, api_keys=keys), route(b, TINY)),
            circuit=CALM,
            # Muted long enough that the three requests always see the keys before them
            # muted (a key back in rotation is drawn first: under load a 0.6 s mute lapsed
            # before the third request and its key was drawn again).
            routing={**bench(failures=3, duration_seconds=30), "key_pool": {"mute_seconds": 2}},
        )
    )
    send = chat(gw)

    async with (
        watch(gw, subjects.event("bench")) as benches,
        watch(gw, subjects.event("keypool")) as key_events,
    ):
        served = []
        for _ in keys:  # each failure mutes its key, so the next request uses the next one
            served.append((await send()).headers["x-routed-via"])
            await key_events.next(KeyMuted)
        benched = await bench_event(benches, eid("m", a))
        for _ in keys:  # every credential is back in rotation; the route stays benched
            await key_events.next(KeyUnmuted)
        after = [(await send()).headers["x-routed-via"] for _ in range(5)]
    deep = (await gw.http().get("/health/deep")).json()

    # Background probes of the muted keys also reach ``a``; client traffic does not.
    client_hits = [r for r in a.requests if r.json and r.json.get("max_tokens") != 1]
    assert [r.credential for r in client_hits] == keys
    assert served == [eid("m", b)] * 3  # each failure failed over; no client saw it
    assert benched.until is not None and benched.until - benched.ts == pytest.approx(30)
    assert after == [eid("m", b)] * 5 and len(client_hits) == 3
    assert deep["endpoints"][eid("m", a)]["benched_until"] == benched.until
    # Why, from the endpoint's own state (a page load sees it, not only a live event).
    assert (
        deep["endpoints"][eid("m", a)]["bench_reason"]
        == benched.reason
        == ("3 failures within 900 s")
    )
    assert deep["endpoints"][eid("m", b)]["bench_reason"] == ""


async def test_bench_retry_after_lengthens_a_bench_and_never_shortens_a_running_one(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    # The admin pin reaches the route while it is benched, as an in-flight request would.
    up.enqueue(Reply(500), Reply(500), retry_after(60), retry_after(5), retry_after(120))
    gw = await gateway_factory(
        config(
            model("m", route(up)),
            circuit=CALM,
            admin_key=ADMIN,
            routing=bench(failures=3, duration_seconds=30),
        )
    )
    client = gw.openai(api_key=ADMIN)
    endpoint = eid("m", up)

    async def pinned() -> Any:
        return await client.chat.completions.create(
            model="m", messages=HI, extra_headers={"X-Route-Pin": endpoint}
        )

    async with (
        watch(gw, subjects.event("bench")) as benches,
        watch(gw, subjects.endpoint_state(endpoint)) as states,
    ):
        for _ in range(3):
            await _fails(pinned)
        started = await bench_event(benches, endpoint)
        await _fails(pinned)  # Retry-After: 5 while ~30 s remain
        kept = await states.state(lambda s: s.consecutive_failures == 4)
        before = time.time()
        await _fails(pinned)  # Retry-After: 120
        after = time.time()
        extended = await states.state(lambda s: s.consecutive_failures == 5)

    assert started.until is not None
    assert started.until - started.ts == pytest.approx(60)  # the third failure's floor
    assert kept.benched_until == started.until
    assert extended.benched_until is not None
    assert before + 120 - 1 <= extended.benched_until <= after + 120 + 1


async def test_bench_probe_success_never_lifts_a_bench_before_the_providers_retry_after(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    # Three failures bench for 2.4 s (probe due after 0.6 s: the fourth request must reach
    # the upstream before the probe does, even on a loaded machine); the fourth says
    # Retry-After: 3. The probe then succeeds, but the provider asked for three seconds.
    up.enqueue(Reply(500), Reply(500), Reply(500), retry_after(3))
    gw = await gateway_factory(
        config(
            model("m", route(up)),
            circuit=CALM,
            admin_key=ADMIN,
            routing=bench(failures=3, duration_seconds=2.4, probe_after_fraction=0.25),
        )
    )
    client = gw.openai(api_key=ADMIN)
    endpoint = eid("m", up)

    async def pinned() -> Any:
        return await client.chat.completions.create(
            model="m", messages=HI, extra_headers={"X-Route-Pin": endpoint}
        )

    async with (
        watch(gw, subjects.event("bench")) as benches,
        watch(gw, subjects.endpoint_state(endpoint)) as states,
    ):
        for _ in range(3):
            await _fails(pinned)
        await bench_event(benches, endpoint)
        await _fails(pinned)
        floor = await states.state(lambda s: s.consecutive_failures == 4)
        await up.wait_for_requests(5)  # the background probe
        lifted = await bench_event(benches, endpoint, benched=False)

    assert floor.benched_until is not None
    assert lifted.ts >= floor.benched_until
    assert lifted.reason == "bench ran out"


async def test_bench_background_probe_failure_rebenches_and_a_later_success_lifts_early(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    # Three client failures, then the first background probe fails; the next one (after twice
    # the gap) succeeds.
    a.enqueue(Reply(500), Reply(500), Reply(500), Reply(503))
    gw = await gateway_factory(
        config(
            model("m", route(a), route(b, TINY)),
            circuit=CALM,
            routing=bench(failures=3, duration_seconds=0.8, probe_after_fraction=0.25),
        )
    )
    send = chat(gw)
    endpoint = eid("m", a)

    async with (
        watch(gw, subjects.event("bench")) as benches,
        watch(gw, subjects.PROBE_DUE) as due,
        watch(gw, subjects.endpoint_state(endpoint)) as states,
    ):
        for _ in range(3):
            await send()
        benched = await bench_event(benches, endpoint)
        first_due = await due.next(ProbeDue)
        rebenched = await bench_event(benches, endpoint)
        second_due = await due.next(ProbeDue)
        lifted = await bench_event(benches, endpoint, benched=False)
        await states.state(lambda s: s.benched_until is None)
        back = (await send()).headers["x-routed-via"]

    probes = a.requests[3:5]
    assert benched.until is not None and rebenched.until is not None
    assert first_due.endpoint == second_due.endpoint == endpoint
    assert rebenched.reason.startswith("background probe failed")
    assert rebenched.until > benched.until
    assert lifted.reason == "background probe succeeded"
    assert lifted.ts < rebenched.until  # lifted before the bench would have run out
    assert [(p.json["max_tokens"], p.json["messages"][0]["content"]) for p in probes] == [
        (1, "ping"),
        (1, "ping"),
    ]
    assert back == endpoint


RETRYABLE: dict[str, Behaviour] = {
    "401": Reply(401),
    "quota_429": Reply(
        429, body={"error": {"message": "quota exceeded", "code": "insufficient_quota"}}
    ),
    "500": Reply(500),
    "empty_stream": Reply(
        200, body="data: [DONE]\n\n", headers={"content-type": "text/event-stream"}
    ),
    "ttft_timeout": Hang(),
}
KEY_REFUSALS = (RETRYABLE["401"], RETRYABLE["quota_429"])
# An answer that came (here empty): the upstream took the key, so it says nothing of it.
ANSWERED = (RETRYABLE["empty_stream"],)


@pytest.mark.parametrize("failure", RETRYABLE.values(), ids=RETRYABLE.keys())
async def test_each_retryable_failure_counts_toward_the_bench_and_mutes_a_key_it_may_blame(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    failure: Behaviour,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    a.enqueue(failure)
    # Short only where the failure is the silence itself: elsewhere a's retry on its other key
    # must not read as silent on a loaded machine (it then fell over to b).
    ttft = 0.3 if failure is RETRYABLE["ttft_timeout"] else 10.0
    gw = await gateway_factory(
        config(
            model(
                "m",
                route(a, api_keys=["sk-one", "sk-two"], ttft_timeout_seconds=ttft),
                route(b, TINY),
            ),
            circuit=CALM,
            routing={**bench(failures=1), "key_pool": {"mute_seconds": 30}},
        )
    )

    async with (
        watch(gw, subjects.event("bench")) as benches,
        watch(gw, subjects.event("keypool")) as key_events,
    ):
        raw = await gw.openai().chat.completions.with_raw_response.create(
            model="m", messages=HI, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
        muted = None if failure in ANSWERED else await key_events.next(KeyMuted)
        benched = await bench_event(benches, eid("m", a))

    # A refusal of the key is served by the same route's other key; anything else moves on.
    served = a if failure in KEY_REFUSALS else b
    assert (raw.headers["x-routed-via"], text) == (eid("m", served), f"Hello from {served.name}.")
    assert benched.benched
    if muted is None:
        keys = (await pool_state(gw, eid("m", a))).keys
        assert [k.muted_until for k in keys] == [None, None]
    else:
        assert muted.credential_id == credential_id("sk-one")
        assert muted.seconds == pytest.approx(30, abs=0.5)


# -- nothing left: 503 with Retry-After -----------------------------------------------------


async def test_every_route_benched_answers_503_with_retry_after_to_the_earliest_recovery(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    a.enqueue(Reply(500))
    b.enqueue(retry_after(90))  # b's bench runs 90 s, a's 30 s
    gw = await gateway_factory(
        config(
            model("m", route(a), route(b, TINY)),
            circuit=CALM,
            routing=bench(failures=1, duration_seconds=30),
        )
    )
    send = chat(gw)

    async with (
        watch(gw, subjects.event("bench")) as benches,
        watch(gw, subjects.ENDPOINT_STATE_ANY) as states,
    ):
        first = await _fails(send)
        a_bench = await bench_event(benches, eid("m", a))
        b_bench = await bench_event(benches, eid("m", b))
        for ep in (eid("m", a), eid("m", b)):
            await states.next(EndpointState, benched_state(ep))
        before = time.time()
        refused = await _fails(send)
        after = time.time()

    assert first.status_code == 502  # the primary's error
    assert a_bench.until is not None and b_bench.until is not None
    assert b_bench.until - b_bench.ts == pytest.approx(90)
    assert_openai_error(refused.response, 503, "all_circuits_open")
    assert int(refused.response.headers["retry-after"]) in expected_retry_after(
        a_bench.until, before, after
    )
    assert (len(a.requests), len(b.requests)) == (1, 1)


async def test_every_key_muted_answers_503_with_retry_after_to_the_first_key_back(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    up.enqueue(Reply(500), Reply(500))
    gw = await gateway_factory(
        config(
            model("m", route(up, api_keys=["sk-one", "sk-two"])),
            circuit=CALM,
            routing={**bench(failures=100), "key_pool": {"mute_seconds": 30}},
        )
    )
    send = chat(gw)

    async with watch(gw, subjects.event("keypool")) as key_events:
        await _fails(send)
        first = await key_events.next(KeyMuted)
        await _fails(send)
        await key_events.next(KeyMuted)
        before = time.time()
        refused = await _fails(send)
        after = time.time()

    assert_openai_error(refused.response, 503, "key_pool_exhausted")
    assert int(refused.response.headers["retry-after"]) in expected_retry_after(
        first.until, before, after
    )
    assert len(up.requests) == 2


async def test_one_route_benched_and_the_other_out_of_keys_retry_after_is_the_earliest(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    a.set_default(Reply(500))
    b.set_default(Reply(500))
    gw = await gateway_factory(
        config(
            model("m", route(a), route(b, TINY, api_key="sk-only")),
            circuit=CALM,
            routing={
                **bench(failures=2, duration_seconds=600),
                "key_pool": {"sole_key_tolerance": 0, "sole_key_backoff_seconds": 20},
            },
        )
    )
    send = chat(gw)

    async with (
        watch(gw, subjects.event("bench")) as benches,
        watch(gw, subjects.event("keypool")) as key_events,
    ):
        await _fails(send)  # a fails, then b fails: b's only key is muted for 20 s
        muted = await key_events.next(KeyMuted)
        await _fails(send)  # a fails again and is benched for 600 s; b is refused unsent
        await bench_event(benches, eid("m", a))
        before = time.time()
        refused = await _fails(send)
        after = time.time()

    assert muted.seconds == pytest.approx(20, abs=0.5)
    assert (len(a.requests), len(b.requests)) == (2, 1)
    assert refused.status_code == 503, refused.response.text
    # b is back when its key is: a refusal sent nothing, so it is no failure of b's model.
    assert int(refused.response.headers["retry-after"]) in expected_retry_after(
        muted.until, before, after
    )


# -- the per-model breaker ------------------------------------------------------------------


async def test_model_breaker_after_n_consecutive_failures_refuses_with_503_until_cooldown(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    a.set_default(Reply(500))
    b.set_default(Reply(503))
    gw = await gateway_factory(
        config(
            model("m", route(a), route(b, TINY)),
            circuit=CALM,
            routing=bench(failures=100, model_breaker_failures=2),
        )
    )
    send = chat(gw)

    async with watch(gw, subjects.event("model_breaker")) as trips:
        first = await _fails(send)  # two failed attempts: a, then b
        tripped = await trips.next(ModelBreakerTripped)
        before = time.time()
        refused = await _fails(send)
        after = time.time()

    assert first.status_code == 502
    assert (tripped.model, tripped.failures) == ("m", 2)
    assert tripped.until - tripped.ts == pytest.approx(30)  # the circuit cooldown
    assert_openai_error(refused.response, 503, "all_circuits_open")
    assert int(refused.response.headers["retry-after"]) in expected_retry_after(
        tripped.until, before, after
    )
    assert (len(a.requests), len(b.requests)) == (1, 1)


# -- credentials: Retry-After is a floor on a mute --------------------------------------------


async def test_credential_retry_after_lengthens_a_mute_and_never_shortens_a_running_one(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    keys = ["sk-one", "sk-two"]
    # Two requests in flight on the same key: the first is told 30 s, the second 1 s.
    up.enqueue(
        Reply(503, headers={"Retry-After": "30"}, delay=0.2),
        Reply(503, headers={"Retry-After": "1"}, delay=0.4),
    )
    gw = await gateway_factory(
        config(
            model("m", route(up, api_keys=keys)),
            circuit=CALM,
            routing={**bench(failures=100), "key_pool": {"mute_seconds": 0.5}},
        )
    )
    send = chat(gw)

    async with watch(gw, subjects.event("keypool")) as key_events:
        calls = [asyncio.create_task(_fails(send)) for _ in range(2)]
        await up.wait_for_requests(2)
        answers = await asyncio.gather(*calls)
        lengthened = await key_events.next(KeyMuted)
        kept = await key_events.next(KeyMuted)

    assert [r.credential for r in up.requests] == [keys[0], keys[0]]
    assert [a.status_code for a in answers] == [502, 502]
    assert lengthened.credential_id == kept.credential_id == credential_id(keys[0])
    assert lengthened.seconds == pytest.approx(30, abs=0.5)  # not the 0.5 s mute
    assert kept.until == lengthened.until
