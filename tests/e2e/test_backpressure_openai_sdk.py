"""Back-pressure through the real server with the openai SDK: a provider's 429 cools the
credential on that route (for its Retry-After or x-ratelimit-reset, else an adaptive
backoff) and the load spills to the next route; it never benches a route, opens a circuit or
mutes a key. A 5xx still benches; an exhausted quota still mutes; a 503 with Retry-After
(the earliest reset) only when every route is cooling. Each route's concurrency limit is
learned (a 429 cuts it); ``fixed`` passes over a route at its limit, and the decision event,
explain and ``/health/deep`` say so.

Fake providers enforce real per-second rate limits on loopback; demand is bounded by a few
client workers and the providers' answer time, so a slower machine only sends less. Nothing
sleeps, and nothing asserts on time.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Any

import msgspec
import openai
import pytest

from schemas import (
    BenchChanged,
    CircuitTransition,
    KeyCooling,
    KeyMuted,
    RouteCapacity,
    RouteDecided,
    subjects,
)
from schemas.config import credential_id
from tests.e2e.conftest import CHAT, HI, assert_openai_error, config, eid, model, route, watch
from tests.fixtures.upstream import Held, Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream, UpstreamFactory

pytestmark = pytest.mark.e2e

CALM = {"failure_threshold": 100, "cooldown_seconds": 30}
SPEC_CIRCUIT = {"failure_threshold": 3, "cooldown_seconds": 30}  # the spec's defaults
TINY = 1e-6


async def _status(call: Any) -> openai.APIStatusError | None:
    try:
        await call
    except openai.APIStatusError as err:
        return err
    return None


async def test_rate_limited_routes_spill_in_order_and_serve_nearly_all_without_bench_or_circuit(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    # Eight providers allowing 4..18 requests a second (88 in all); four client workers and a
    # 0.1 s answer keep demand at or under 40 a second: about half of what they allow.
    limits = (4, 6, 8, 10, 12, 14, 16, 18)
    ups = [
        await fake_upstreams(f"p{i}", rate_limit=n, default=Reply(delay=0.1))
        for i, n in enumerate(limits)
    ]
    routes = [
        route(up, api_key=f"sk-{up.name}", fallback_only=i > 0)  # cheapest primary first
        for i, up in enumerate(ups)
    ]
    gw = await gateway_factory(config(model("m", *routes), circuit=SPEC_CIRCUIT))
    client = gw.openai()
    total, workers = 200, 4
    queue = list(range(total))
    failed: list[int] = []

    async def worker() -> None:
        while queue:
            queue.pop()
            err = await _status(client.chat.completions.create(model="m", messages=HI))
            if err is not None:
                failed.append(err.status_code)

    async with (
        watch(gw, subjects.event("bench")) as benches,
        watch(gw, subjects.event("circuit")) as circuits,
        watch(gw, subjects.event("keypool")) as key_events,
    ):
        await asyncio.gather(*(worker() for _ in range(workers)))
        cooled = await key_events.next(KeyCooling)

    served = sum(len(up.requests) - len(up.refused) for up in ups)
    assert total - len(failed) >= math.ceil(0.995 * total), failed
    assert served == total - len(failed)
    assert sum(len(up.refused) for up in ups) > 0  # the providers did push back
    assert cooled.hinted and cooled.seconds == pytest.approx(1.0)  # their Retry-After: 1
    assert not [e for e in benches.seen if isinstance(e, BenchChanged)]
    assert not [e for e in circuits.seen if isinstance(e, CircuitTransition)]
    assert not [e for e in key_events.seen if isinstance(e, KeyMuted)]
    assert len(ups[0].requests) - len(ups[0].refused) > 0  # the primary kept serving


async def test_every_route_cooling_answers_503_with_retry_after_to_the_earliest_reset(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    a.enqueue(Reply(429, headers={"Retry-After": "30"}))
    # b (no key: the route itself cools) says when through OpenAI's reset headers only.
    b.enqueue(
        Reply(
            429,
            headers={"x-ratelimit-reset-requests": "20s", "x-ratelimit-remaining-requests": "0"},
        )
    )
    gw = await gateway_factory(
        config(model("m", route(a, api_key="sk-a"), route(b, TINY)), circuit=SPEC_CIRCUIT)
    )
    client = gw.openai()

    async with watch(gw, subjects.event("keypool")) as key_events:
        first = await _status(
            client.chat.completions.with_raw_response.create(model="m", messages=HI)
        )
        a_cool = await key_events.next(KeyCooling, lambda e: e.pool == eid("m", a))
        b_cool = await key_events.next(KeyCooling, lambda e: e.pool == eid("m", b))
        before = time.time()
        refused = await _status(
            client.chat.completions.with_raw_response.create(model="m", messages=HI)
        )
        after = time.time()

    assert first is not None and first.status_code == 429  # the primary's own answer
    # ... saying when the first route it met is back (b's 20 s, not the primary's own 30 s:
    # the very next request is told 20 s too).
    assert first.response.headers["retry-after"] == "20"
    assert a_cool.credential_id == credential_id("sk-a")
    assert a_cool.seconds == pytest.approx(30)
    assert b_cool.credential_id == ""
    assert b_cool.seconds == pytest.approx(20)
    assert refused is not None
    assert_openai_error(refused.response, 503, "all_circuits_open")
    wait = int(refused.response.headers["retry-after"])
    assert wait in range(math.ceil(b_cool.until - after), math.ceil(b_cool.until - before) + 1)
    assert (len(a.requests), len(b.requests)) == (1, 1)  # nothing sent while cooling


async def test_every_route_cooling_with_the_reset_near_waits_for_it_and_serves(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    a.enqueue(Reply(429, headers={"Retry-After": "1"}))  # then it answers again
    b.enqueue(Reply(429, headers={"Retry-After": "1"}))
    gw = await gateway_factory(
        config(model("m", route(a), route(b, fallback_only=True)), circuit=SPEC_CIRCUIT)
    )

    raw = await gw.openai().chat.completions.with_raw_response.create(model="m", messages=HI)

    # Both cooled at once; the request waited for the first reset (within
    # failover.cooling_wait_seconds, 2 s) instead of answering 429 or 503, and a was back
    # in rotation at its Retry-After: a second after its 429, well under a second more.
    assert raw.headers["x-routed-via"] == eid("m", a)
    assert (len(a.requests), len(b.requests)) == (2, 1)
    back = a.requests[1].t - a.requests[0].t
    assert 1.0 - 0.05 <= back <= 1.0 + 1.0


@pytest.mark.parametrize("retry_after", ["0", "-5", "nan"])
async def test_a_429_asking_for_no_wait_is_not_sent_again_at_once_by_the_request_that_met_it(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
    retry_after: str,
) -> None:
    # Taken at its word, "Retry-After: 0" left the key in rotation, so the request's walk
    # found the route free again at once: 20 calls in 16 ms to a provider refusing, up to the
    # attempt cap. Now it cools the key as a 429 without a hint does.
    a = await fake_upstreams("a", default=Reply(429, headers={"Retry-After": retry_after}))
    no_wait = {"failover": {"cooling_wait_seconds": 0}}
    gw = await gateway_factory(config(model("m", route(a)), routing=no_wait))

    err = await _status(gw.openai().chat.completions.create(model="m", messages=HI))

    assert err is not None and err.status_code == 429
    assert len(a.requests) == 1


async def test_429s_never_bench_a_route_and_5xx_sickness_still_does(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    keys = [f"sk-{i}" for i in range(6)]  # each 429 cools one key, each 500 mutes one
    # Cooling for as long as the test: without a hint a key cools for a second, which a
    # busy machine can spend between two of the requests below (sk-0 was back for the 2nd).
    slow = {"Retry-After": "600"}
    a.enqueue(*(Reply(429, headers=slow) for _ in range(3)), *(Reply(500) for _ in range(3)))
    gw = await gateway_factory(
        config(
            model("m", route(a, api_keys=keys), route(b, TINY)),
            circuit=CALM,
            routing={"bench": {"failures": 3, "duration_seconds": 600}},
        )
    )
    client = gw.openai()

    async with (
        watch(gw, subjects.event("bench")) as benches,
        watch(gw, subjects.event("keypool")) as key_events,
    ):
        for kind in (KeyCooling, KeyCooling, KeyCooling, KeyMuted, KeyMuted, KeyMuted):
            raw = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
            assert raw.headers["x-routed-via"] == eid("m", b)  # every failure failed over
            await key_events.next(kind)  # the pool's views know before the next request
        benched = await benches.next(BenchChanged, lambda e: e.benched)

    # Had the three 429s counted, a would have been benched before the 500s reached it.
    assert [r.credential for r in a.requests] == keys
    assert benched.endpoint == eid("m", a)
    assert benched.reason.startswith("3 failures")


async def test_an_exhausted_quota_is_no_backpressure_its_key_is_muted(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
) -> None:
    up = fake_upstream
    quota = {"error": {"message": "You exceeded your current quota", "type": "insufficient_quota"}}
    up.enqueue(Reply(429, body=quota))
    gw = await gateway_factory(
        config(
            model("m", route(up, api_keys=["sk-one", "sk-two"])),
            circuit=CALM,
            routing={"key_pool": {"mute_seconds": 300}},
        )
    )

    async with watch(gw, subjects.event("keypool")) as key_events:
        await _status(gw.openai().chat.completions.create(model="m", messages=HI))
        muted = await key_events.next(KeyMuted)

    assert (muted.credential_id, muted.reason) == (credential_id("sk-one"), "quota_exhausted")
    assert muted.seconds == pytest.approx(300, abs=1)
    assert not [e for e in key_events.seen if isinstance(e, KeyCooling)]


# -- learned capacity: fixed spills before a route saturates --------------------------------

ADMIN = "sk-admin-backpressure"


async def test_fixed_spills_past_a_route_at_its_learned_limit_and_says_so(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    # A 429 cooling its key for a microsecond teaches a's limit: the floor, 2 in flight.
    a.enqueue(Reply(429), Held(), Held())
    gw = await gateway_factory(
        config(
            model("m", route(a), route(b, fallback_only=True)),
            circuit=SPEC_CIRCUIT,
            routing={"key_pool": {"cooling_seconds": TINY}},
            admin_key=ADMIN,
        )
    )
    client = gw.openai()
    admin = gw.http(headers={"authorization": f"Bearer {ADMIN}"})

    async with (
        watch(gw, subjects.event("capacity")) as learned,
        watch(gw, subjects.event("decision")) as decisions,
    ):
        first = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
        cut = await learned.next(RouteCapacity)
        held = [
            asyncio.create_task(client.chat.completions.create(model="m", messages=HI))
            for _ in range(2)
        ]
        await a.wait_for_requests(3)  # both held on a: a is at its limit
        spilled = await client.chat.completions.with_raw_response.create(model="m", messages=HI)
        explained = (
            await admin.post(
                "/admin/routing/explain",
                json={"path": CHAT, "body": {"model": "m", "messages": HI}},
            )
        ).json()
        deep = (await admin.get("/health/deep")).json()
        decided = await decisions.next(RouteDecided, lambda d: bool(d.skipped))
        a.release_held()
        await asyncio.gather(*held)

    assert first.headers["x-routed-via"] == eid("m", b)  # the 429 failed over
    assert (cut.endpoint, cut.reason, cut.limit) == (eid("m", a), "rate_limited", 2.0)
    assert spilled.headers["x-routed-via"] == eid("m", b)  # a is full: the next in order
    assert len(a.requests) == 3  # the spilled request never reached a
    skip = {"endpoint": eid("m", a), "reason": "capacity", "limit": 2.0, "in_flight": 2}
    assert explained["plan"]["candidates"][0]["endpoint"] == eid("m", b)
    assert explained["plan"]["skipped"] == [{**skip, "until": None}]
    assert [msgspec.structs.asdict(s) for s in decided.skipped] == [{**skip, "until": None}]
    line = deep["load"]["m"][eid("m", a)]
    assert (line["in_flight"], line["learned_limit"], line["limit_reason"]) == (
        2,
        2.0,
        "rate_limited",
    )


async def test_a_cooling_route_is_named_in_the_decision_with_when_it_is_back(
    gateway_factory: GatewayFactory,
    fake_upstreams: UpstreamFactory,
) -> None:
    a, b = await fake_upstreams("a"), await fake_upstreams("b")
    a.enqueue(Reply(429, headers={"Retry-After": "30"}))
    gw = await gateway_factory(
        config(model("m", route(a), route(b, fallback_only=True)), circuit=SPEC_CIRCUIT)
    )
    client = gw.openai()

    async with (
        watch(gw, subjects.event("keypool")) as key_events,
        watch(gw, subjects.event("decision")) as decisions,
    ):
        await client.chat.completions.create(model="m", messages=HI)
        cooling = await key_events.next(KeyCooling)
        await client.chat.completions.create(model="m", messages=HI)
        decided = await decisions.next(RouteDecided, lambda d: bool(d.skipped))

    assert decided.primary == eid("m", b)
    # The ModelActor marked a cooling from the observation itself, a moment after its owner.
    assert [(s.endpoint, s.reason) for s in decided.skipped] == [(eid("m", a), "cooling")]
    assert decided.skipped[0].until == pytest.approx(cooling.until, abs=1.0)
    assert len(a.requests) == 1
