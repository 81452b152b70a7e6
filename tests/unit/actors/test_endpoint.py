"""EndpointActor on the in-process bus: observations in, state and circuit events out, the
half-open probe lease, and the loud auth-rejection signal."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest

from actors import ChildSpec, EndpointActor, Supervisor
from schemas import (
    AuthRejected,
    BenchChanged,
    CircuitTransition,
    EndpointState,
    Observation,
    ProbeDue,
    ProbeFirstByte,
    ProbeGrant,
    ProbeRequest,
    ProbeResult,
    RouteCandidate,
    StateRequest,
    subjects,
)
from schemas.config import BenchConfig, CircuitConfig
from tests.unit.actors import FakeClock, next_event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from bus import InProcessBus, Subscription

EP = "m:local-8001"
SETTINGS = CircuitConfig(
    failure_threshold=3, cooldown_seconds=30, min_availability=0.7, ewma_alpha=0.1
)


@asynccontextmanager
async def running(bus: InProcessBus, actor: EndpointActor) -> AsyncIterator[EndpointActor]:
    """``actor`` serving under a supervisor (whose start and stop may run in different tasks,
    as a fixture's setup and teardown do)."""
    root = Supervisor("test", children=[ChildSpec("endpoint", lambda: actor)])
    await root.start(bus)
    try:
        yield actor
    finally:
        await root.stop()


@pytest.fixture
async def states(bus: InProcessBus) -> AsyncIterator[Subscription]:
    async with bus.subscribe(subjects.endpoint_state(EP)) as sub:
        yield sub


@pytest.fixture
async def circuit(bus: InProcessBus) -> AsyncIterator[Subscription]:
    async with bus.subscribe(subjects.event("circuit")) as sub:
        yield sub


@pytest.fixture
async def endpoint(
    bus: InProcessBus, clock: FakeClock, states: Subscription, circuit: Subscription
) -> AsyncIterator[EndpointActor]:
    """A running EndpointActor for EP; its initial state event is already consumed."""
    async with running(bus, EndpointActor(EP, "m", SETTINGS, clock=clock)) as actor:
        await next_event(states, EndpointState)
        yield actor


def obs(outcome: str, **kw: Any) -> Observation:
    return Observation(endpoint=EP, model="m", outcome=outcome, **kw)


async def observe(bus: InProcessBus, *observations: Observation) -> None:
    for o in observations:
        await bus.publish(subjects.observation(EP), o)


async def probe(bus: InProcessBus) -> ProbeGrant:
    reply = await bus.request(
        subjects.endpoint_probe(EP), ProbeRequest(), reply_type=ProbeGrant, timeout=5.0
    )
    assert isinstance(reply, ProbeGrant), reply
    return reply


async def open_circuit(bus: InProcessBus, circuit: Subscription) -> CircuitTransition:
    await observe(bus, *(obs("failure", status=500) for _ in range(3)))
    return await next_event(circuit, CircuitTransition)


async def test_endpoint_on_start_publishes_closed_healthy_state(
    bus: InProcessBus,
    clock: FakeClock,
    states: Subscription,
) -> None:
    async with running(bus, EndpointActor(EP, "m", SETTINGS, clock=clock)):
        first = await next_event(states, EndpointState)

    assert (first.endpoint, first.model, first.circuit_state) == (EP, "m", "closed")
    assert (first.availability, first.consecutive_failures, first.open_until) == (1.0, 0, None)


async def test_endpoint_failure_observation_publishes_lower_availability_and_streak(
    bus: InProcessBus,
    endpoint: EndpointActor,
    states: Subscription,
) -> None:
    await observe(bus, obs("failure", status=503))
    st = await next_event(states, EndpointState)

    assert (st.circuit_state, st.consecutive_failures) == ("closed", 1)
    assert st.availability == pytest.approx(0.9)


async def test_endpoint_client_errors_and_cancellations_are_not_failures(
    bus: InProcessBus,
    endpoint: EndpointActor,
    states: Subscription,
) -> None:
    await observe(
        bus,
        *(obs("client_error", status=400) for _ in range(5)),
        *(obs("cancelled") for _ in range(5)),
        obs("failure", status=500),
    )
    st = await next_event(states, EndpointState)

    # The one state change is the final failure: nothing before it counted.
    assert (st.circuit_state, st.consecutive_failures) == ("closed", 1)
    assert st.availability == pytest.approx(0.9)


async def test_endpoint_success_resets_the_failure_streak(
    bus: InProcessBus,
    endpoint: EndpointActor,
    states: Subscription,
) -> None:
    await observe(bus, obs("failure"), obs("failure"), obs("success"), obs("failure"))
    streaks = [(await next_event(states, EndpointState)).consecutive_failures for _ in range(4)]

    assert streaks == [1, 2, 0, 1]


async def test_endpoint_after_threshold_failures_opens_for_the_cooldown(
    bus: InProcessBus,
    clock: FakeClock,
    endpoint: EndpointActor,
    states: Subscription,
    circuit: Subscription,
) -> None:
    opened = await open_circuit(bus, circuit)
    st = await next_event(states, EndpointState)
    while st.circuit_state != "open":  # the states of the first two failures come first
        st = await next_event(states, EndpointState)

    assert (opened.endpoint, opened.model, opened.old, opened.new) == (EP, "m", "closed", "open")
    assert opened.reason == "3 consecutive failures"
    assert st.open_until == clock.now + 30
    assert st.consecutive_failures == 3


async def test_endpoint_probe_before_cooldown_is_refused_with_time_left(
    bus: InProcessBus,
    clock: FakeClock,
    endpoint: EndpointActor,
    circuit: Subscription,
) -> None:
    await open_circuit(bus, circuit)
    clock.now += 10

    grant = await probe(bus)

    assert grant == ProbeGrant(granted=False, retry_after=20.0)


async def test_endpoint_probe_after_cooldown_is_granted_exactly_once(
    bus: InProcessBus,
    clock: FakeClock,
    endpoint: EndpointActor,
    circuit: Subscription,
) -> None:
    await open_circuit(bus, circuit)
    clock.now += 30

    grants = await asyncio.gather(*(probe(bus) for _ in range(10)))
    half_open = await next_event(circuit, CircuitTransition)
    state = endpoint.state()

    assert [g.granted for g in grants].count(True) == 1
    assert all(g.retry_after is not None and g.retry_after > 0 for g in grants if not g.granted)
    assert (half_open.old, half_open.new) == ("open", "half_open")
    assert (state.circuit_state, state.probe_in_flight) == ("half_open", True)


@pytest.mark.parametrize(
    ("outcome", "status", "new", "reason"),
    [
        ("success", 200, "closed", "probe succeeded"),
        ("client_error", 400, "closed", "probe succeeded"),  # an answered 4xx proves it is up
        ("failure", 500, "open", "probe failed"),
        ("cancelled", None, "open", "probe abandoned by its client"),
    ],
)
async def test_endpoint_probe_outcome_closes_or_reopens(
    bus: InProcessBus,
    clock: FakeClock,
    endpoint: EndpointActor,
    circuit: Subscription,
    outcome: str,
    status: int | None,
    new: str,
    reason: str,
) -> None:
    await open_circuit(bus, circuit)
    clock.now += 30
    assert (await probe(bus)).granted
    await next_event(circuit, CircuitTransition)  # open -> half_open

    await observe(bus, obs(outcome, status=status, probe=True))
    after = await next_event(circuit, CircuitTransition)

    assert (after.old, after.new, after.reason) == ("half_open", new, reason)
    assert endpoint.state().probe_in_flight is False
    if new == "open":
        assert endpoint.state().open_until == clock.now + 30


async def test_endpoint_stream_probe_closes_at_its_first_byte_not_at_stream_end(
    bus: InProcessBus,
    clock: FakeClock,
    endpoint: EndpointActor,
    circuit: Subscription,
) -> None:
    await open_circuit(bus, circuit)
    clock.now += 30
    reply = await bus.request(
        subjects.endpoint_probe(EP), ProbeRequest(request_id="r1"), reply_type=ProbeGrant, timeout=2
    )
    assert isinstance(reply, ProbeGrant) and reply.granted
    await next_event(circuit, CircuitTransition)  # open -> half_open

    await bus.publish(
        subjects.endpoint_probe_result(EP), ProbeFirstByte(endpoint=EP, request_id="someone-else")
    )
    # A request queues behind the event in the actor's mailbox: the stale byte was ignored.
    after_stale = await bus.request(
        subjects.endpoint_get(EP), StateRequest(), reply_type=EndpointState, timeout=2
    )
    await bus.publish(
        subjects.endpoint_probe_result(EP), ProbeFirstByte(endpoint=EP, request_id="r1")
    )
    closed = await next_event(circuit, CircuitTransition)

    assert isinstance(after_stale, EndpointState) and after_stale.circuit_state == "half_open"
    assert (closed.old, closed.new) == ("half_open", "closed")
    assert endpoint.state().probe_in_flight is False


async def _lease(bus: InProcessBus, request_id: str) -> ProbeGrant:
    reply = await bus.request(
        subjects.endpoint_probe(EP),
        ProbeRequest(request_id=request_id),
        reply_type=ProbeGrant,
        timeout=2,
    )
    assert isinstance(reply, ProbeGrant), reply
    return reply


@pytest.mark.parametrize("late_by", [40.0, 200.0])
async def test_endpoint_probe_success_after_the_cooldown_closes_the_circuit(
    bus: InProcessBus,
    clock: FakeClock,
    circuit: Subscription,
    late_by: float,
) -> None:
    # The probe's deadline is the route's timeout (120 s) plus a cooldown of grace (30 s), not
    # one cooldown; a success from the holder closes the circuit within it (40 s) and even
    # after it (200 s).
    actor = EndpointActor(EP, "m", SETTINGS, probe_timeout=120, clock=clock)
    async with running(bus, actor):
        await open_circuit(bus, circuit)
        clock.now += 30
        assert (await _lease(bus, "r1")).granted
        await next_event(circuit, CircuitTransition)  # open -> half_open
        clock.now += late_by
        other = await _lease(bus, "r2")  # asking evaluates the deadline at this time
        await observe(bus, obs("success", status=200, probe=True, request_id="r1"))
        closed = await next_event(circuit, CircuitTransition)
        while closed.new != "closed":
            closed = await next_event(circuit, CircuitTransition)

    assert not other.granted
    assert closed.reason == ("probe succeeded" if late_by < 150 else "late probe succeeded")
    assert actor.state().circuit_state == "closed"


async def test_endpoint_late_first_byte_from_the_timed_out_probe_closes_the_circuit(
    bus: InProcessBus,
    clock: FakeClock,
    circuit: Subscription,
) -> None:
    actor = EndpointActor(EP, "m", SETTINGS, probe_timeout=60, clock=clock)
    async with running(bus, actor):
        await open_circuit(bus, circuit)
        clock.now += 30
        assert (await _lease(bus, "r1")).granted
        await next_event(circuit, CircuitTransition)  # open -> half_open
        clock.now += 90  # the route's 60 s and the cooldown's 30 s of grace
        await _lease(bus, "r2")  # the deadline passed: open again
        reopened = await next_event(circuit, CircuitTransition)
        await bus.publish(
            subjects.endpoint_probe_result(EP), ProbeFirstByte(endpoint=EP, request_id="r1")
        )
        closed = await next_event(circuit, CircuitTransition)

    assert (reopened.new, reopened.reason) == ("open", "probe timed out")
    assert (closed.old, closed.new, closed.reason) == ("open", "closed", "late probe succeeded")


async def test_endpoint_cooldown_elapsing_half_opens_without_any_request(
    bus: InProcessBus,
    circuit: Subscription,
) -> None:
    quick = CircuitConfig(failure_threshold=1, cooldown_seconds=0.05)
    async with running(bus, EndpointActor(EP, "m", quick)):
        await observe(bus, obs("failure"))
        opened = await next_event(circuit, CircuitTransition)
        half_open = await next_event(circuit, CircuitTransition)

    assert (opened.new, half_open.new, half_open.reason) == (
        "open",
        "half_open",
        "cooldown elapsed",
    )


async def test_endpoint_half_open_probe_no_request_takes_is_sent_in_the_background(
    bus: InProcessBus,
    circuit: Subscription,
) -> None:
    # Every caller pinned to another route: no request asks for the probe lease. The
    # prober's answer decides the circuit as the probe's would (failed: open again; ok: closed).
    quick = CircuitConfig(failure_threshold=1, cooldown_seconds=0.05)
    candidate = RouteCandidate(endpoint=EP, kind="openai_compat", base_url="http://x/v1")
    actor = EndpointActor(EP, "m", quick, candidate=candidate)
    async with bus.subscribe(subjects.PROBE_DUE) as due, running(bus, actor):
        await observe(bus, obs("failure"))
        seen = [await next_event(circuit, CircuitTransition) for _ in range(2)]
        first = await next_event(due, ProbeDue)
        refused = await _lease(bus, "a-request")
        await bus.publish(subjects.endpoint_probe_result(EP), ProbeResult(endpoint=EP, ok=False))
        seen += [await next_event(circuit, CircuitTransition) for _ in range(2)]
        await next_event(due, ProbeDue)
        await bus.publish(subjects.endpoint_probe_result(EP), ProbeResult(endpoint=EP, ok=True))
        seen.append(await next_event(circuit, CircuitTransition))

    assert first.candidate == candidate
    assert not refused.granted  # the background probe holds it
    assert [(t.new, t.reason) for t in seen] == [
        ("open", "1 consecutive failures"),
        ("half_open", "cooldown elapsed"),
        ("open", "probe failed"),
        ("half_open", "cooldown elapsed"),
        ("closed", "probe succeeded"),
    ]


async def test_endpoint_half_open_circuit_of_a_route_benched_meanwhile_is_probed_after_it(
    bus: InProcessBus,
    states: Subscription,
    circuit: Subscription,
) -> None:
    # The circuit's probe comes due while a bench holds the route (whose own probes go
    # unanswered here); once the bench is over, the circuit, still half-open with no request
    # to take its probe, gets one.
    quick = CircuitConfig(failure_threshold=1, cooldown_seconds=0.05)
    bench = BenchConfig(failures=1, duration_seconds=0.3)
    candidate = RouteCandidate(endpoint=EP, kind="openai_compat", base_url="http://x/v1")
    actor = EndpointActor(EP, "m", quick, bench=bench, candidate=candidate)
    async with bus.subscribe(subjects.event("bench")) as benches, running(bus, actor):
        await observe(bus, obs("failure", status=503))
        seen = [await next_event(circuit, CircuitTransition) for _ in range(2)]
        over = [await next_event(benches, BenchChanged) for _ in range(2)]
        while not (st := await next_event(states, EndpointState)).probe_in_flight:
            pass
        await bus.publish(subjects.endpoint_probe_result(EP), ProbeResult(endpoint=EP, ok=True))
        seen.append(await next_event(circuit, CircuitTransition))

    assert [(b.benched, b.reason) for b in over][1] == (False, "bench ran out")
    assert st.circuit_state == "half_open" and st.benched_until is None
    assert [t.new for t in seen] == ["open", "half_open", "closed"]


async def test_endpoint_auth_rejection_is_announced_from_the_first_one(
    bus: InProcessBus,
    endpoint: EndpointActor,
    states: Subscription,
) -> None:
    rejected = obs("failure", status=401, auth_rejection=True, credential_id="k-abc")
    async with bus.subscribe(subjects.event("auth_rejected")) as events:
        await observe(bus, rejected)
        first = await next_event(events, AuthRejected)
        await observe(bus, rejected)
        second = await next_event(events, AuthRejected)
    await observe(bus, obs("success"))
    counts = [
        (await next_event(states, EndpointState)).consecutive_auth_rejections for _ in range(3)
    ]

    assert (first.endpoint, first.status, first.consecutive, first.credential_id) == (
        EP,
        401,
        1,
        "k-abc",
    )
    assert second.consecutive == 2
    assert counts == [1, 2, 0]


async def test_endpoint_answers_state_requests(
    bus: InProcessBus,
    endpoint: EndpointActor,
    states: Subscription,
) -> None:
    await observe(bus, obs("failure"))
    published = await next_event(states, EndpointState)

    reply = await bus.request(
        subjects.endpoint_get(EP), StateRequest(), reply_type=EndpointState, timeout=5.0
    )

    assert reply == published
