"""ModelActor on the in-process bus: the plan it answers (primary first, fallbacks in
declaration order), what it leaves out (weight 0, open circuits), the half-open probe lease,
all circuits open, and the admin pin; under load: a 429 it observes passes over the route on
the very next plan (before the key pool's state arrives), its in-flight count per route ends
however an attempt ends, and ``fixed`` spills past a route at its learned limit."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import anyio
import pytest

from actors import ChildSpec, ModelActor, Supervisor
from schemas import (
    EndpointState,
    ErrorCode,
    ErrorReply,
    FirstToken,
    ModelStatus,
    ModelStatusRequest,
    Observation,
    ProbeGrant,
    ProbeRequest,
    RouteBatch,
    RouteBatchReply,
    RoutePlan,
    RouteRequest,
    RouteSkip,
    subjects,
)
from schemas.config import ModelConfig, RoutingConfig
from schemas.keys import KeyPoolState, PoolKey
from schemas.routing import RateReport
from tests.unit.actors import WAIT, FakeClock

if TYPE_CHECKING:
    from bus import InProcessBus

DRAWS = 300  # plans per statistical check; a route of weight 1/3 is missed with p ~ 1e-53


def endpoint(port: int) -> str:
    return f"m:local-{port}"


A, B, C, Z = endpoint(8001), endpoint(8002), endpoint(8003), endpoint(8009)


def model_config(*routes: tuple[int, float]) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "id": "m",
            "route": [
                {
                    "kind": "openai_compat",
                    "base_url": f"http://127.0.0.1:{port}/v1",
                    "weight": weight,
                    "provider_model_id": f"up-{port}",
                }
                for port, weight in routes
            ],
        }
    )


Start = Callable[..., Any]


@pytest.fixture
async def start_model(bus: InProcessBus, clock: FakeClock) -> AsyncIterator[Start]:
    """``await start_model((port, weight), ...)`` runs a ModelActor for model ``m``."""
    roots: list[Supervisor] = []

    async def start(*routes: tuple[int, float]) -> ModelActor:
        cfg = model_config(*routes)
        routing = RoutingConfig.model_validate({"affinity": {"enabled": False}})
        root = Supervisor(
            "test", children=[ChildSpec("model", lambda: ModelActor(cfg, routing, clock=clock))]
        )
        roots.append(root)
        await root.start(bus)
        actor = root.child("model")
        assert isinstance(actor, ModelActor)
        return actor

    yield start
    for root in reversed(roots):
        await root.stop()


async def ask(bus: InProcessBus, **kw: Any) -> RoutePlan | ErrorReply:
    return await bus.request(
        subjects.model_route("m"), RouteRequest(model="m", **kw), reply_type=RoutePlan, timeout=WAIT
    )


async def plan(bus: InProcessBus, **kw: Any) -> RoutePlan:
    reply = await ask(bus, **kw)
    assert isinstance(reply, RoutePlan), reply
    return reply


async def status(bus: InProcessBus) -> ModelStatus:
    reply = await bus.request(
        subjects.model_status("m"), ModelStatusRequest(), reply_type=ModelStatus, timeout=WAIT
    )
    assert isinstance(reply, ModelStatus), reply
    return reply


_seq = iter(range(1, 1_000_000))


async def set_state(
    bus: InProcessBus,
    ep: str,
    circuit: str,
    *,
    open_until: float | None = None,
    probe_in_flight: bool = False,
) -> None:
    """Publish ``ep``'s state as its owner would, and wait until the model's view has it (no
    event says so: a bounded loop of status requests, each awaited)."""
    await bus.publish(
        subjects.endpoint_state(ep),
        EndpointState(
            endpoint=ep,
            model="m",
            circuit_state=circuit,
            availability=0.5,
            open_until=open_until,
            probe_in_flight=probe_in_flight,
            seq=next(_seq),
        ),
    )
    for _ in range(100):
        seen = {r.endpoint: r.circuit_state for r in (await status(bus)).routes}
        if seen[ep] == circuit:
            return
    raise AssertionError(f"the model never saw {ep} {circuit}")


async def test_model_plan_puts_the_drawn_primary_first_then_the_rest_in_declared_order(
    bus: InProcessBus,
    start_model: Start,
) -> None:
    await start_model((8001, 1), (8002, 1), (8003, 1))

    plans = [await plan(bus) for _ in range(DRAWS)]

    primaries = Counter(p.candidates[0].endpoint for p in plans)
    assert set(primaries) == {A, B, C}
    for p in plans:
        order = [c.endpoint for c in p.candidates]
        assert sorted(order) == [A, B, C]
        assert order[1:] == [e for e in (A, B, C) if e != order[0]]
        assert not p.pinned and not any(c.probe for c in p.candidates)


async def test_model_plan_carries_what_the_ingress_needs_for_each_route(
    bus: InProcessBus,
    start_model: Start,
) -> None:
    await start_model((8001, 1))

    (cand,) = (await plan(bus)).candidates

    assert (cand.endpoint, cand.kind, cand.base_url, cand.upstream_model) == (
        A,
        "openai_compat",
        "http://127.0.0.1:8001/v1",
        "up-8001",
    )


async def test_model_plan_never_includes_a_weight_zero_route(
    bus: InProcessBus,
    start_model: Start,
) -> None:
    await start_model((8001, 1), (8009, 0), (8002, 1))

    plans = [await plan(bus) for _ in range(DRAWS)]

    assert all(Z not in [c.endpoint for c in p.candidates] for p in plans)
    assert {p.candidates[0].endpoint for p in plans} == {A, B}


async def test_model_plan_follows_weights_in_its_draw(
    bus: InProcessBus,
    start_model: Start,
) -> None:
    await start_model((8001, 3), (8002, 1))
    n, p = 800, 0.75

    primaries = Counter([(await plan(bus)).candidates[0].endpoint for _ in range(n)])

    sigma = (n * p * (1 - p)) ** 0.5
    assert abs(primaries[A] - n * p) <= 4 * sigma, primaries


@pytest.mark.parametrize(("circuit", "probe_in_flight"), [("open", False), ("half_open", True)])
async def test_model_plan_leaves_out_a_refusing_circuit(
    bus: InProcessBus,
    clock: FakeClock,
    start_model: Start,
    circuit: str,
    probe_in_flight: bool,
) -> None:
    await start_model((8001, 1), (8002, 1), (8003, 1))
    until = clock.now + 30 if circuit == "open" else None
    await set_state(bus, B, circuit, open_until=until, probe_in_flight=probe_in_flight)

    plans = [await plan(bus) for _ in range(DRAWS)]

    for p in plans:
        assert [c.endpoint for c in p.candidates if c.endpoint != p.candidates[0].endpoint] == [
            e for e in (A, C) if e != p.candidates[0].endpoint
        ]
        assert B not in [c.endpoint for c in p.candidates]
    await set_state(bus, B, "closed")
    assert B in [c.endpoint for c in (await plan(bus)).candidates]


async def test_model_plan_after_cooldown_leases_the_single_probe_from_the_owner(
    bus: InProcessBus,
    clock: FakeClock,
    start_model: Start,
) -> None:
    await start_model((8001, 1))
    await set_state(bus, A, "open", open_until=clock.now + 30)
    refused_early = await ask(bus)
    clock.now += 30
    leases: list[ProbeRequest] = []

    async with bus.subscribe(subjects.endpoint_probe(A)) as sub, anyio.create_task_group() as tg:

        async def owner() -> None:  # grants the first lease only, as the EndpointActor does
            async for env in sub:
                leases.append(env.message)  # type: ignore[arg-type]
                await env.respond(ProbeGrant(granted=len(leases) == 1, retry_after=30.0))

        tg.start_soon(owner)
        first = await plan(bus)
        second = await ask(bus)
        tg.cancel_scope.cancel()

    assert isinstance(refused_early, ErrorReply)
    assert refused_early.code == ErrorCode.ALL_CIRCUITS_OPEN
    assert [(c.endpoint, c.probe) for c in first.candidates] == [(A, True)]
    assert isinstance(second, ErrorReply) and second.code == ErrorCode.ALL_CIRCUITS_OPEN
    assert len(leases) == 2


async def test_model_dry_plan_reports_the_probe_it_would_take_without_leasing_it(
    bus: InProcessBus,
    clock: FakeClock,
    start_model: Start,
) -> None:
    await start_model((8001, 1))
    await set_state(bus, A, "half_open")
    leases: list[ProbeRequest] = []

    async with bus.subscribe(subjects.endpoint_probe(A)) as sub, anyio.create_task_group() as tg:

        async def owner() -> None:  # grants the first lease only, as the EndpointActor does
            async for env in sub:
                leases.append(env.message)  # type: ignore[arg-type]
                await env.respond(ProbeGrant(granted=len(leases) == 1, retry_after=30.0))

        tg.start_soon(owner)
        dry = [await plan(bus, dry=True, request_id=f"explain-{i}") for i in range(3)]
        live = await plan(bus, request_id="live")
        tg.cancel_scope.cancel()

    for p in (*dry, live):
        assert [(c.endpoint, c.probe) for c in p.candidates] == [(A, True)]
    assert [lease.request_id for lease in leases] == ["live"]  # the dry runs leased nothing


async def test_model_plan_with_probe_lease_refused_uses_the_closed_routes(
    bus: InProcessBus,
    clock: FakeClock,
    start_model: Start,
) -> None:
    await start_model((8001, 1), (8002, 1))
    await set_state(bus, A, "half_open")

    async with bus.subscribe(subjects.endpoint_probe(A)) as sub, anyio.create_task_group() as tg:

        async def owner() -> None:
            async for env in sub:
                await env.respond(ProbeGrant(granted=False, retry_after=5.0))

        tg.start_soon(owner)
        plans = [await plan(bus) for _ in range(50)]
        tg.cancel_scope.cancel()

    assert {tuple(c.endpoint for c in p.candidates) for p in plans} == {(B,)}


async def test_model_with_every_circuit_open_answers_retry_after_of_the_earliest_probe(
    bus: InProcessBus,
    clock: FakeClock,
    start_model: Start,
) -> None:
    await start_model((8001, 1), (8002, 1), (8009, 0))
    await set_state(bus, A, "open", open_until=clock.now + 25)
    await set_state(bus, B, "open", open_until=clock.now + 10)
    clock.now += 2

    reply = await ask(bus)

    assert isinstance(reply, ErrorReply)
    assert reply.code == ErrorCode.ALL_CIRCUITS_OPEN
    assert reply.retryable
    assert reply.retry_after == pytest.approx(8.0)


@pytest.mark.parametrize("pin", [B, Z])
async def test_model_plan_with_pin_is_that_route_alone_and_pinned(
    bus: InProcessBus,
    start_model: Start,
    pin: str,
) -> None:
    await start_model((8001, 1), (8002, 1), (8009, 0))

    p = await plan(bus, pin=pin)

    assert p.pinned
    assert [c.endpoint for c in p.candidates] == [pin]


async def test_model_plan_with_pin_of_no_route_answers_pin_not_found(
    bus: InProcessBus,
    start_model: Start,
) -> None:
    await start_model((8001, 1))

    reply = await ask(bus, pin="m:local-1")

    assert isinstance(reply, ErrorReply) and reply.code == ErrorCode.PIN_NOT_FOUND


async def test_model_answers_a_batch_of_route_requests_each_with_its_own_plan_or_error(
    bus: InProcessBus,
    start_model: Start,
) -> None:
    await start_model((8001, 1), (8002, 1))
    batch = RouteBatch(
        requests=(
            RouteRequest(model="m", request_id="r-1", pin=B),
            RouteRequest(model="m", request_id="r-2", pin="m:local-1"),  # no such route
            RouteRequest(model="m", request_id="r-3"),
        )
    )

    reply = await bus.request(
        subjects.model_route("m"), batch, reply_type=RouteBatchReply, timeout=WAIT
    )

    assert isinstance(reply, RouteBatchReply)
    pinned, refused, drawn = reply.replies
    assert isinstance(pinned, RoutePlan) and [c.endpoint for c in pinned.candidates] == [B]
    assert isinstance(refused, ErrorReply) and refused.code == ErrorCode.PIN_NOT_FOUND
    assert isinstance(drawn, RoutePlan) and {c.endpoint for c in drawn.candidates} == {A, B}
    in_flight = {r.endpoint: r.in_flight for r in (await status(bus)).routes}
    assert sum(in_flight.values()) == 2  # the two plans are issued, as if asked one by one


async def test_model_status_reports_effective_weights_and_the_circuits_it_sees(
    bus: InProcessBus,
    clock: FakeClock,
    start_model: Start,
) -> None:
    await start_model((8001, 3), (8009, 0))
    await set_state(bus, A, "open", open_until=clock.now + 30)

    st = await status(bus)

    assert st.model == "m" and st.router == "fixed"
    assert [(r.endpoint, r.kind, r.weight, r.circuit_state) for r in st.routes] == [
        (A, "openai_compat", 3.0, "open"),
        (Z, "openai_compat", 0.0, "closed"),
    ]


# -- under load ---------------------------------------------------------------------------------


def rate_limited(endpoint: str, request_id: str = "", retry_after: float | None = 30.0) -> Any:
    return Observation(
        endpoint=endpoint,
        model="m",
        outcome="failure",
        status=429,
        error_kind="http_429",
        retry_after=retry_after,
        request_id=request_id,
    )


async def loads(bus: InProcessBus) -> dict[str, tuple[int, float | None]]:
    return {r.endpoint: (r.in_flight, r.learned_limit) for r in (await status(bus)).routes}


def endpoints(p: RoutePlan) -> list[str]:
    return [c.endpoint for c in p.candidates]


async def test_model_a_429_it_observes_passes_over_the_route_on_the_next_plan(
    bus: InProcessBus, clock: FakeClock, start_model: Start
) -> None:
    await start_model((8001, 1), (8002, 1))  # no key pool actor runs: the view marks itself
    await bus.publish(subjects.observation(A), rate_limited(A))

    cooled = await plan(bus)
    clock.now += 30
    back = await plan(bus)

    assert endpoints(cooled) == [B]
    assert cooled.skipped == (RouteSkip(endpoint=A, reason="cooling", until=1000.0 + 30),)
    assert A in endpoints(back) and back.skipped == ()


async def test_model_a_route_back_from_cooling_gets_the_next_request_whatever_the_draw(
    bus: InProcessBus, clock: FakeClock, start_model: Start
) -> None:
    await start_model((8001, 1), (8002, 99))  # the draw all but never lands on A
    await bus.publish(subjects.observation(A), rate_limited(A, retry_after=1.0))
    cooling = await plan(bus)
    clock.now += 1

    back = await plan(bus)
    after = [await plan(bus) for _ in range(3)]

    assert endpoints(cooling) == [B]
    assert (endpoints(back)[0], back.reason) == (A, "cooled")  # at the reset
    assert all(p.reason != "cooled" for p in after)  # one request, then the draw's again


async def test_model_every_route_cooling_refuses_with_the_earliest_end(
    bus: InProcessBus, clock: FakeClock, start_model: Start
) -> None:
    await start_model((8001, 1), (8002, 1))
    await bus.publish(subjects.observation(A), rate_limited(A, retry_after=30))
    await bus.publish(subjects.observation(B), rate_limited(B, retry_after=12))

    reply = await ask(bus)

    assert not isinstance(reply, RoutePlan)
    assert (reply.code, reply.retry_after) == ("all_circuits_open", 12.0)
    assert reply.cooling  # the ingress may wait for it: back-pressure, not sickness


async def test_model_routes_out_partly_for_cooling_refuse_as_cooling_so_requests_may_wait(
    bus: InProcessBus, clock: FakeClock, start_model: Start
) -> None:
    await start_model((8001, 1), (8002, 1))
    await set_state(bus, B, "open", open_until=1000.0 + 30)
    await bus.publish(subjects.observation(A), rate_limited(A, retry_after=1.0))

    reply = await ask(bus)

    assert not isinstance(reply, RoutePlan)
    assert (reply.code, reply.retry_after) == ("all_circuits_open", 1.0)  # A's reset
    assert reply.cooling  # before: a plain refusal, answered 503 at once


async def test_model_counts_in_flight_until_the_attempt_ends_or_is_never_sent(
    bus: InProcessBus, start_model: Start
) -> None:
    await start_model((8001, 1))
    for rid in ("r1", "r2", "r3"):
        await plan(bus, request_id=rid)
    assert (await loads(bus))[A][0] == 3

    ok = Observation(endpoint=A, model="m", outcome="success", request_id="r1")
    await bus.publish(subjects.observation(A), ok)
    gone = Observation(endpoint=A, model="m", outcome="cancelled", request_id="r2")
    await bus.publish(subjects.observation(A), gone)
    await bus.publish(
        subjects.model_first_token("m"), FirstToken(endpoint=A, request_id="r3", unsent=True)
    )
    await plan(bus, dry=True)  # a dry plan counts nothing

    assert (await loads(bus))[A][0] == 0


async def test_model_fixed_spills_past_a_route_at_its_learned_limit_unless_all_are_full(
    bus: InProcessBus, clock: FakeClock, start_model: Start
) -> None:
    await start_model((8001, 1), (8002, 1e-9))
    await bus.publish(subjects.observation(A), rate_limited(A, retry_after=1))  # limit 2
    await plan(bus, dry=True)  # the 429 is folded in
    clock.now += 1  # its cooling is over, the learned limit stays
    held = [await plan(bus, request_id=f"r{i}") for i in range(2)]
    assert [p.candidates[0].endpoint for p in held] == [A, A]

    spilled = await plan(bus, request_id="r2")
    after_spill = await loads(bus)
    # B is at a learned limit too now: nothing is left to spill to, the draw decides.
    await bus.publish(subjects.observation(B), rate_limited(B, retry_after=1))
    await plan(bus, dry=True)
    clock.now += 1
    for i in range(3, 5):
        await plan(bus, request_id=f"r{i}")
    unspilled = await plan(bus, dry=True)

    assert endpoints(spilled) == [B, A]  # A kept last among the fallbacks
    assert spilled.skipped == (RouteSkip(endpoint=A, reason="capacity", limit=2.0, in_flight=2),)
    assert after_spill[A] == (2, 2.0)
    assert unspilled.skipped == ()


async def test_model_fixed_spills_past_a_route_whose_provider_said_its_limit_is_spent(
    bus: InProcessBus, clock: FakeClock, start_model: Start
) -> None:
    await start_model((8001, 1), (8002, 1e-9))
    # A's answer came with x-ratelimit-remaining-requests: 0, the window freeing in 2 s.
    await bus.publish(
        subjects.model_first_token("m"), FirstToken(endpoint=A, request_id="r0", spent_for=2.0)
    )
    spent = await plan(bus, dry=True)
    clock.now += 2
    reset = await plan(bus, dry=True)

    assert endpoints(spent) == [B, A]
    assert spent.skipped[0] == RouteSkip(endpoint=A, reason="rate_limit", until=clock.now)
    assert endpoints(reset)[0] == A and reset.skipped == ()


async def test_model_fixed_spills_past_a_route_once_the_requests_its_provider_has_left_are_sent(
    bus: InProcessBus, clock: FakeClock, start_model: Start
) -> None:
    await start_model((8001, 1), (8002, 1e-9))
    first = await plan(bus, request_id="r0")
    # r0's answer: a limit of 2, 1 left once r0 was taken, all back in a second.
    rate = RateReport(limit=2, remaining=1, reset_seconds=1.0)
    await bus.publish(
        subjects.model_first_token("m"), FirstToken(endpoint=A, request_id="r0", rate=rate)
    )
    second = await plan(bus, request_id="r1")  # A takes the one left
    spilled = await plan(bus, dry=True)
    clock.now += 1.0  # one is back
    back = await plan(bus, dry=True)

    assert endpoints(first)[0] == A and endpoints(second)[0] == A
    assert endpoints(spilled) == [B, A]
    skip = RouteSkip(endpoint=A, reason="rate_limit", until=clock.now, in_flight=2)
    assert spilled.skipped[0] == skip  # in flight: r0, r1; back when one refilled
    assert endpoints(back)[0] == A and back.skipped == ()


async def test_model_paces_a_route_by_what_a_whole_answer_reported(
    bus: InProcessBus, clock: FakeClock, start_model: Start
) -> None:
    await start_model((8001, 1), (8002, 1e-9))
    await plan(bus, request_id="r0")
    rate = RateReport(limit=2, remaining=0, reset_seconds=1.0)  # none left once r0 was taken
    answered = Observation(endpoint=A, model="m", outcome="success", request_id="r0", rate=rate)
    await bus.publish(subjects.observation(A), answered)
    spilled = await plan(bus, dry=True)
    clock.now += 0.5  # one is back
    back = await plan(bus, dry=True)

    assert endpoints(spilled) == [B, A] and spilled.skipped[0].reason == "rate_limit"
    assert endpoints(back)[0] == A


async def test_model_paces_a_route_by_its_token_limit_with_each_requests_prompt(
    bus: InProcessBus, clock: FakeClock, start_model: Start
) -> None:
    await start_model((8001, 1), (8002, 1e-9))
    await plan(bus, request_id="r0", prompt_tokens=600)
    # r0's answer: 600 prompt and 400 output tokens; plenty of requests left but 2,500 of
    # 10,000 tokens (all back in 7.5 s: a thousand a second).
    tokens = RateReport(limit=10_000, remaining=2_500, reset_seconds=7.5)
    rate = RateReport(limit=100, remaining=99, reset_seconds=1.0, tokens=tokens)
    answered = Observation(
        endpoint=A,
        model="m",
        outcome="success",
        request_id="r0",
        rate=rate,
        prompt_tokens=600,
        completion_tokens=400,
    )
    await bus.publish(subjects.observation(A), answered)
    # A request takes its prompt and the average answer (400), and is sent with room for two.
    small = await plan(bus, request_id="r1", prompt_tokens=100)  # takes 500: 2,000 left
    larger = await plan(bus, dry=True, prompt_tokens=1_700)  # 2,500 room: not there
    fits = await plan(bus, request_id="r2", prompt_tokens=1_100)  # 1,900 room; 500 left
    smaller = await plan(bus, dry=True, prompt_tokens=0)  # 800 room: not there
    # Operators see it spent until the smallest request fits.
    shown = {r.endpoint: r.rate_limit_until for r in (await status(bus)).routes}
    clock.now += 0.3  # 300 are back: 800
    back = await plan(bus, dry=True, prompt_tokens=0)

    assert endpoints(small)[0] == A and endpoints(fits)[0] == A
    assert endpoints(larger) == [B, A] and endpoints(smaller) == [B, A]
    assert [(s.reason, s.in_flight) for s in (larger.skipped[0], smaller.skipped[0])] == [
        ("rate_limit", 1),
        ("rate_limit", 2),
    ]
    # Until the room it needs is back: 500 tokens after the larger, 300 after the smaller.
    assert larger.skipped[0].until == pytest.approx(clock.now - 0.3 + 0.5)
    assert smaller.skipped[0].until == pytest.approx(clock.now)
    assert shown[A] == pytest.approx(clock.now) and shown[B] is None
    assert endpoints(back)[0] == A and back.skipped == ()


async def test_model_paces_each_key_of_a_route_apart(
    bus: InProcessBus, clock: FakeClock, start_model: Start
) -> None:
    await start_model((8001, 1), (8002, 1e-9))
    keys = (PoolKey(credential_id="k-1"), PoolKey(credential_id="k-2"))
    await bus.publish(subjects.keypool_state(A), KeyPoolState(pool=A, keys=keys, seq=1))
    first = await plan(bus, request_id="r0")
    key = first.candidates[0].credential_id
    spent = RateReport(limit=2, remaining=0, reset_seconds=20.0)  # none left on that key
    said = FirstToken(endpoint=A, request_id="r0", rate=spent, credential_id=key)
    await bus.publish(subjects.model_first_token("m"), said)
    one_spent = await plan(bus, dry=True)
    drawn = await plan(bus, request_id="r1")  # the same caller, bound to the spent key
    other = "k-2" if key == "k-1" else "k-1"
    said = FirstToken(endpoint=A, request_id="rx", rate=spent, credential_id=other)
    await bus.publish(subjects.model_first_token("m"), said)
    both_spent = await plan(bus, dry=True)
    added = (*keys, PoolKey(credential_id="k-3"))  # an operator adds a key
    await bus.publish(subjects.keypool_state(A), KeyPoolState(pool=A, keys=added, seq=2))
    with_a_new_key = await plan(bus, dry=True)

    # A provider meters each key apart: one key spent leaves the route to the other.
    assert key in ("k-1", "k-2")
    assert endpoints(one_spent)[0] == A and one_spent.skipped == ()
    # ... and the key with requests left is drawn first, the binding notwithstanding.
    assert drawn.candidates[0].credential_id == other
    assert drawn.candidates[0].spare_credentials == (key,)
    assert endpoints(both_spent) == [B, A] and both_spent.skipped[0].reason == "rate_limit"
    assert endpoints(with_a_new_key)[0] == A and with_a_new_key.skipped == ()


async def test_model_draws_the_key_whose_token_limit_has_room_for_the_request(
    bus: InProcessBus, clock: FakeClock, start_model: Start
) -> None:
    await start_model((8001, 1), (8002, 1e-9))
    keys = (PoolKey(credential_id="k-1"), PoolKey(credential_id="k-2"))
    await bus.publish(subjects.keypool_state(A), KeyPoolState(pool=A, keys=keys, seq=1))
    first = await plan(bus, request_id="r0", prompt_tokens=100)
    key = first.candidates[0].credential_id
    other = "k-2" if key == "k-1" else "k-1"
    plenty = RateReport(limit=100, remaining=99, reset_seconds=1.0)
    # r0's key has 500 tokens of 100,000 left, the other key 50,000 (a minute to refill).
    for rid, k, left in (("r0", key, 500), ("rx", other, 50_000)):
        tokens = RateReport(limit=100_000, remaining=left, reset_seconds=60.0)
        said = FirstToken(
            endpoint=A, request_id=rid, rate=with_tokens(plenty, tokens), credential_id=k
        )
        await bus.publish(subjects.model_first_token("m"), said)
    large = [await plan(bus, request_id=f"r{i}", prompt_tokens=2_000) for i in (1, 2)]

    # The route has room for them (on the other key), and they are sent with that key.
    assert [p.candidates[0].endpoint for p in large] == [A, A]
    assert [p.candidates[0].credential_id for p in large] == [other, other]


def with_tokens(requests: RateReport, tokens: RateReport) -> RateReport:
    return RateReport(
        limit=requests.limit,
        remaining=requests.remaining,
        reset_seconds=requests.reset_seconds,
        tokens=tokens,
    )


async def test_model_unpaced_is_still_spent_by_a_report_of_none_left(
    bus: InProcessBus, clock: FakeClock
) -> None:
    routing = RoutingConfig.model_validate(
        {"affinity": {"enabled": False}, "learned_capacity": {"pace_rate_limits": False}}
    )
    cfg = model_config((8001, 1), (8002, 1e-9))
    root = Supervisor(
        "test", children=[ChildSpec("model", lambda: ModelActor(cfg, routing, clock=clock))]
    )
    await root.start(bus)
    try:
        await plan(bus, request_id="r0")
        one_left = RateReport(limit=2, remaining=1, reset_seconds=20.0)
        await bus.publish(
            subjects.model_first_token("m"), FirstToken(endpoint=A, request_id="r0", rate=one_left)
        )
        await plan(bus, request_id="r1")  # paced, this would spend A
        unpaced = await plan(bus, dry=True)
        none_left = RateReport(limit=2, remaining=0, reset_seconds=20.0)
        await bus.publish(
            subjects.model_first_token("m"), FirstToken(endpoint=A, request_id="r1", rate=none_left)
        )
        said_spent = await plan(bus, dry=True)
        said_at = clock.now
        clock.now += 20.0
        tokens_plans = []
        for left in (50, 0):  # tokens left: unpaced, only none left spends the route
            tokens = RateReport(limit=9_000, remaining=left, reset_seconds=5.0)
            said = FirstToken(endpoint=A, request_id="r1", rate=with_tokens(one_left, tokens))
            await bus.publish(subjects.model_first_token("m"), said)
            tokens_plans.append(await plan(bus, dry=True))
        tokens_unpaced, tokens_spent = tokens_plans
    finally:
        await root.stop()

    assert endpoints(tokens_unpaced)[0] == A and tokens_unpaced.skipped == ()
    assert tokens_spent.skipped[0].until == clock.now + 5.0  # its token limit is all back
    assert endpoints(unpaced)[0] == A and unpaced.skipped == ()
    # As before pacing: until all of it is back.
    assert said_spent.skipped == (
        RouteSkip(endpoint=A, reason="rate_limit", until=said_at + 20.0, in_flight=2),
    )
