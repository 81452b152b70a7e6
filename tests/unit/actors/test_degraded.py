"""Degraded mode: the pure state machine (entry and exit periods, no flapping), the
DegradedModeActor's health pass over endpoint states, and a ModelActor keeping to the
configured order while degraded. The actor runs on the in-process bus with a fake clock; its
passes are called directly (the scheduled interval is set far beyond the test)."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import pytest

from actors import ChildSpec, ModelActor, Supervisor
from actors.degraded import DEGRADED, NORMAL, DegradedMode, DegradedModeActor
from schemas import (
    EndpointState,
    ModeChanged,
    ModeRequest,
    RoutePlan,
    RouteRequest,
    subjects,
)
from schemas.config import DegradedConfig, ModelConfig, RoutingConfig
from tests.unit.actors import WAIT, FakeClock, next_event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from bus import InProcessBus

SETTINGS = DegradedConfig(
    threshold=0.5, entry_seconds=60, exit_seconds=180, pass_interval_seconds=10
)


def test_degraded_settings_default_to_the_spec_numbers() -> None:
    d = DegradedConfig()
    assert (d.enabled, d.threshold, d.entry_seconds, d.exit_seconds) == (True, 0.5, 60.0, 180.0)
    assert d.pass_interval_seconds == 10.0


def passes(m: DegradedMode, *ratios_at: tuple[float, float]) -> list[bool]:
    return [m.observe(ratio, t) for t, ratio in ratios_at]


# -- the state machine ------------------------------------------------------------------------


def test_mode_with_ratio_low_for_less_than_the_entry_period_stays_normal() -> None:
    m = DegradedMode(SETTINGS, 0.0)

    assert passes(m, (0, 0.2), (30, 0.2), (59, 0.2)) == [False] * 3
    assert m.mode == NORMAL


def test_mode_with_ratio_low_for_the_entry_period_enters_degraded_then() -> None:
    m = DegradedMode(SETTINGS, 0.0)

    assert passes(m, (10, 0.2), (40, 0.4), (70, 0.0)) == [False, False, True]
    assert (m.mode, m.since) == (DEGRADED, 70)


def test_mode_one_healthy_pass_during_entry_restarts_the_entry_period() -> None:
    m = DegradedMode(SETTINGS, 0.0)

    changed = passes(m, (0, 0.2), (50, 0.2), (55, 0.9), (60, 0.2), (110, 0.2), (120, 0.2))

    assert changed == [False, False, False, False, False, True]
    assert m.since == 120


def test_mode_ratio_at_the_threshold_counts_as_healthy() -> None:
    m = DegradedMode(SETTINGS, 0.0)

    assert passes(m, (0, 0.5), (100, 0.5)) == [False, False]
    assert m.mode == NORMAL


def _degraded_at(t: float) -> DegradedMode:
    m = DegradedMode(SETTINGS, 0.0)
    passes(m, (t - 60, 0.0), (t, 0.0))
    assert m.mode == DEGRADED
    return m


def test_mode_exit_needs_the_longer_exit_period_above_the_threshold() -> None:
    m = _degraded_at(100)

    changed = passes(m, (110, 0.8), (200, 0.8), (289, 0.8), (290, 0.8))

    # 60 s above would have been enough to enter; leaving takes 180.
    assert changed == [False, False, False, True]
    assert (m.mode, m.since) == (NORMAL, 290)


def test_mode_one_bad_pass_during_exit_restarts_the_exit_period() -> None:
    m = _degraded_at(100)

    changed = passes(m, (110, 1.0), (280, 1.0), (285, 0.1), (290, 1.0), (469, 1.0), (470, 1.0))

    assert changed == [False, False, False, False, False, True]
    assert m.mode == NORMAL


def test_mode_with_alternating_passes_never_flaps() -> None:
    m = DegradedMode(SETTINGS, 0.0)

    changed = passes(m, *((t, 0.0 if (t // 10) % 2 else 1.0) for t in range(0, 1000, 10)))

    assert not any(changed)
    assert m.mode == NORMAL


def test_mode_disabled_never_leaves_normal() -> None:
    m = DegradedMode(DegradedConfig(enabled=False, entry_seconds=0), 0.0)

    assert passes(m, (0, 0.0), (1000, 0.0)) == [False, False]
    assert m.mode == NORMAL


# -- the actor --------------------------------------------------------------------------------

EPS = ("m:a", "m:b", "m:c", "m:d")


@asynccontextmanager
async def running_mode(
    bus: InProcessBus, clock: FakeClock, endpoints: tuple[str, ...] = EPS
) -> AsyncIterator[DegradedModeActor]:
    settings = SETTINGS.model_copy(update={"pass_interval_seconds": 3600})
    actor = DegradedModeActor(endpoints, settings, 0.7, clock=clock)
    root = Supervisor("test", children=[ChildSpec("degraded_mode", lambda: actor)])
    await root.start(bus)
    try:
        yield actor
    finally:
        await root.stop()


_seq = iter(range(1, 1_000_000))


def state(
    ep: str,
    *,
    circuit: str = "closed",
    availability: float = 1.0,
    benched_until: float | None = None,
    probe_in_flight: bool = False,
    seq: int | None = None,
) -> EndpointState:
    return EndpointState(
        endpoint=ep,
        model="m",
        circuit_state=circuit,
        availability=availability,
        benched_until=benched_until,
        probe_in_flight=probe_in_flight,
        seq=next(_seq) if seq is None else seq,
    )


async def mode(bus: InProcessBus) -> ModeChanged:
    reply = await bus.request(
        subjects.MODE_GET, ModeRequest(), reply_type=ModeChanged, timeout=WAIT
    )
    assert isinstance(reply, ModeChanged), reply
    return reply


async def fold(
    bus: InProcessBus,
    actor: DegradedModeActor,
    clock: FakeClock,
    *states: EndpointState,
    ratio: float,
) -> None:
    """Publish ``states`` as their owners would and wait until the actor's ratio is ``ratio``
    (no event says a state was folded: a bounded loop of awaited mode requests)."""
    for st in states:
        await bus.publish(subjects.endpoint_state(st.endpoint), st)
    for _ in range(100):
        if actor.healthy_ratio(clock.now) == pytest.approx(ratio):
            return
        await mode(bus)
    raise AssertionError(f"ratio stayed {actor.healthy_ratio(clock.now)}, wanted {ratio}")


async def test_mode_actor_counts_endpoints_with_no_reported_state_as_healthy(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with running_mode(bus, clock) as actor:
        await fold(bus, actor, clock, state("m:a", circuit="open"), ratio=0.75)
        await actor.health_pass()
        current = await mode(bus)

    assert (current.mode, current.ratio) == (NORMAL, 0.75)


async def test_mode_actor_counts_open_half_open_benched_and_low_availability_as_unhealthy(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with running_mode(bus, clock) as actor:
        await fold(
            bus,
            actor,
            clock,
            state("m:a", circuit="open"),
            state("m:b", circuit="half_open"),
            state("m:c", benched_until=clock.now + 10),
            state("m:d", availability=0.69),
            ratio=0.0,
        )
        clock.now += 10  # c's bench is over
        assert actor.healthy_ratio(clock.now) == 0.25


async def test_mode_actor_while_degraded_counts_routes_awaiting_a_probe_as_healthy(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with running_mode(bus, clock) as actor:
        await fold(bus, actor, clock, *(state(e, circuit="open") for e in EPS[:3]), ratio=0.25)
        for _ in range(2):
            await actor.health_pass()
            clock.now += 60
        assert actor.machine.mode == DEGRADED
        # No traffic reaches these while degraded: neither a probe nor a success can come.
        await fold(
            bus,
            actor,
            clock,
            state("m:a", circuit="half_open"),
            state("m:b", availability=0.3),
            ratio=0.75,
        )
        await fold(
            bus, actor, clock, state("m:b", circuit="half_open", probe_in_flight=True), ratio=0.5
        )
        await fold(
            bus,
            actor,
            clock,
            state("m:b", benched_until=clock.now + 10),
            state("m:a", circuit="open"),
            ratio=0.25,
        )


async def test_mode_actor_enters_after_the_entry_period_with_an_event_and_answers_the_mode(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with bus.subscribe(subjects.event("mode")) as events, running_mode(bus, clock) as actor:
        before = await mode(bus)
        await fold(bus, actor, clock, *(state(e, circuit="open") for e in EPS[:3]), ratio=0.25)
        await actor.health_pass()
        clock.now += 59
        await actor.health_pass()
        still = await mode(bus)
        clock.now += 1
        await actor.health_pass()
        entered = await next_event(events, ModeChanged)
        current = await mode(bus)

    assert (before.mode, before.since) == (NORMAL, 1000.0)
    assert still.mode == NORMAL
    assert (entered.mode, entered.since, entered.ratio) == (DEGRADED, 1060.0, 0.25)
    assert (current.mode, current.since) == (DEGRADED, 1060.0)


async def test_mode_actor_exits_only_after_the_exit_period_without_flapping(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with bus.subscribe(subjects.event("mode")) as events, running_mode(bus, clock) as actor:
        await fold(bus, actor, clock, *(state(e, circuit="open") for e in EPS[:3]), ratio=0.25)
        for _ in range(2):
            await actor.health_pass()
            clock.now += 60
        entered = await next_event(events, ModeChanged)
        await fold(bus, actor, clock, *(state(e) for e in EPS[:3]), ratio=1.0)
        await actor.health_pass()  # the exit period starts
        clock.now += 100
        await fold(
            bus,
            actor,
            clock,
            state("m:a", circuit="open"),
            state("m:b", circuit="open"),
            state("m:c", circuit="open"),
            ratio=0.25,
        )
        await actor.health_pass()  # one bad pass: the exit period starts over
        await fold(bus, actor, clock, *(state(e) for e in EPS[:3]), ratio=1.0)
        clock.now += 1
        await actor.health_pass()
        clock.now += 179
        await actor.health_pass()
        still = await mode(bus)
        clock.now += 1
        await actor.health_pass()
        left = await next_event(events, ModeChanged)

    assert entered.mode == DEGRADED
    assert still.mode == DEGRADED
    assert (left.mode, left.since, left.ratio) == (NORMAL, clock.now, 1.0)


async def test_mode_actor_ignores_an_older_state_of_an_endpoint(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with running_mode(bus, clock, ("m:a", "m:b")) as actor:
        await fold(
            bus, actor, clock, state("m:a", seq=10), state("m:b", circuit="open", seq=5), ratio=0.5
        )
        # A stale "open" for a, then b's newer "closed" as a barrier.
        await fold(
            bus, actor, clock, state("m:a", circuit="open", seq=9), state("m:b", seq=6), ratio=1.0
        )


# -- a ModelActor while degraded -----------------------------------------------------------

A, B, C = "m:local-8001", "m:local-8002", "m:local-8003"


def model_config() -> ModelConfig:
    # Declared order A, B, C; the draw almost never picks A or B while C is admissible.
    return ModelConfig.model_validate(
        {
            "id": "m",
            "route": [
                {"kind": "openai_compat", "base_url": f"http://127.0.0.1:{p}/v1", "weight": w}
                for p, w in ((8001, 1e-6), (8002, 1e-6), (8003, 1.0))
            ],
        }
    )


@asynccontextmanager
async def running_model(bus: InProcessBus, clock: FakeClock) -> AsyncIterator[None]:
    routing = RoutingConfig.model_validate({"affinity": {"enabled": False}})
    root = Supervisor(
        "test",
        children=[ChildSpec("model", lambda: ModelActor(model_config(), routing, clock=clock))],
    )
    await root.start(bus)
    try:
        yield
    finally:
        await root.stop()


async def plan(bus: InProcessBus, **kw: Any) -> RoutePlan:
    reply = await bus.request(
        subjects.model_route("m"), RouteRequest(model="m", **kw), reply_type=RoutePlan, timeout=WAIT
    )
    assert isinstance(reply, RoutePlan), reply
    return reply


async def plan_when(bus: InProcessBus, reason: str, primary: str) -> RoutePlan:
    """The first plan with ``reason`` and ``primary`` (the model folds events asynchronously:
    a bounded loop of awaited requests)."""
    for _ in range(100):
        p = await plan(bus)
        if p.reason == reason and p.candidates[0].endpoint == primary:
            return p
    raise AssertionError(f"no plan with reason {reason!r} and primary {primary}")


async def set_mode(bus: InProcessBus, name: str) -> None:
    await bus.publish(subjects.event("mode"), ModeChanged(mode=name, since=0.0, ratio=0.0))


async def test_model_while_degraded_keeps_to_configured_order_of_what_remains(
    bus: InProcessBus,
    clock: FakeClock,
) -> None:
    async with running_model(bus, clock):
        normal = [(await plan(bus)).candidates[0].endpoint for _ in range(20)]
        await set_mode(bus, "degraded")
        first = await plan_when(bus, "degraded", A)
        degraded = [await plan(bus, caller=f"c{i}") for i in range(20)]
        await bus.publish(
            subjects.endpoint_state(A),
            EndpointState(
                endpoint=A,
                model="m",
                circuit_state="open",
                availability=0.5,
                open_until=clock.now + 30,
                seq=1,
            ),
        )
        without_a = await plan_when(bus, "degraded", B)
        await set_mode(bus, "normal")
        back = await plan_when(bus, "fixed", C)

    assert normal == [C] * 20
    assert [c.endpoint for c in first.candidates] == [A, B, C]
    assert all(
        [c.endpoint for c in p.candidates] == [A, B, C] and p.reason == "degraded" for p in degraded
    )
    assert [c.endpoint for c in without_a.candidates] == [B, C]
    assert not any(c.probe for c in without_a.candidates)  # no exploration of the open route
    assert [c.endpoint for c in back.candidates] == [C, B]
