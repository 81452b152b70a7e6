"""The SteeringActor's evidence publishing on the in-process bus: a change that flips an
ordering, a model's health or the mode reaches the views at once, whatever the interval
(failures, a 429's penalty, allowance use); other changes wait for the interval's end, or go
at once after a quiet interval (leading edge); a 429's penalty wearing off is published only
when it flips an ordering or ends. The interval is set far beyond the test and the clock is
a fake one, so what is published at once is told apart from what waits without sleeping: a
SteeringGet answered after the change means the actor handled it, and an evidence publish
made while handling it is then already queued for the test's subscription."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import actors.steering as steering_module
from actors import ChildSpec, Supervisor
from actors.steering import SteeringActor, _DecayCheck
from bus.inprocess import BufferedSubscription
from gateway.steering.resolver import book_from
from schemas import (
    Evidence,
    ModeChanged,
    Observation,
    SteeringGet,
    SteeringSnapshot,
    SteeringState,
    subjects,
)
from schemas.catalog import SteeringConfig
from schemas.config import ModelConfig
from tests.unit.actors import WAIT, FakeClock, next_event

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import pytest

    from bus import InProcessBus

MODELS = tuple(ModelConfig.model_validate({"id": m}) for m in ("x", "y"))


@asynccontextmanager
async def steering(
    bus: InProcessBus,
    clock: FakeClock,
    models: tuple[ModelConfig, ...] = MODELS,
    actor: SteeringActor | None = None,
) -> AsyncIterator[BufferedSubscription]:
    """A SteeringActor over ``models`` (or ``actor``) publishing at most once an hour but for
    what flips; yields the evidence subscription, past the evidence published at start."""
    if actor is None:
        actor = SteeringActor(models, (), SteeringConfig(exploration=0), clock=clock)
    actor.flush_seconds = 3600.0
    async with bus.subscribe(subjects.STEERING_EVIDENCE) as sub:
        assert isinstance(sub, BufferedSubscription)  # it counts what is queued
        root = Supervisor("test", children=[ChildSpec("steering", lambda: actor)])
        await root.start(bus)
        try:
            await next_event(sub, Evidence)
            yield sub
        finally:
            await root.stop()


def _obs(model: str, outcome: str = "success", status: int | None = None) -> Observation:
    return Observation(
        endpoint=f"{model}:up",
        model=model,
        outcome=outcome,
        status=status,
        latency_ms=10.0,
        completion_tokens=5,
    )


async def handled(bus: InProcessBus, *messages: Observation | ModeChanged) -> None:
    """Send ``messages`` to the actor and return once it handled them (its mailbox is
    first in, first out: the answer to a SteeringGet sent after them comes after them)."""
    for msg in messages:
        if isinstance(msg, ModeChanged):
            await bus.publish(subjects.event("mode"), msg)
        else:
            await bus.publish(subjects.observation(msg.endpoint), msg)
    reply = await bus.request(
        subjects.STEERING_GET, SteeringGet(), reply_type=SteeringSnapshot, timeout=WAIT
    )
    assert isinstance(reply, SteeringSnapshot), reply


def first(evidence: Evidence, name: str, models: tuple[ModelConfig, ...] = MODELS) -> str:
    """The model an ingress holding ``evidence`` routes ``name`` to first."""
    book = book_from(models, SteeringState(exploration=0), {}, evidence)
    return book.ordering(name, "")[4].candidates[0].model


async def test_failures_that_flip_an_ordering_are_published_at_once_within_the_interval(
    bus: InProcessBus, clock: FakeClock
) -> None:
    async with steering(bus, clock) as sub:
        await handled(bus, _obs("x"))  # x leads auto:reliable; flips nothing
        held = sub.pending
        await handled(bus, _obs("x", "failure", 500), _obs("x", "failure", 500))
        at_once = sub.pending
        flipped = await next_event(sub, Evidence)

    assert held == 0  # within the interval: waits for its end
    # The first failure put x behind y: published before the actor took its next message;
    # the second flips nothing more and waits.
    assert at_once == 1 and first(flipped, "auto:reliable") == "y"


async def test_a_429_penalty_and_degraded_mode_reach_the_views_at_once(
    bus: InProcessBus, clock: FakeClock
) -> None:
    async with steering(bus, clock) as sub:
        await handled(bus, _obs("x", "failure", 429))
        penalised = sub.pending
        rate_limited = await next_event(sub, Evidence)
        await handled(bus, ModeChanged(mode="degraded", since=clock.now, ratio=0.4))
        moded = sub.pending
        degraded = await next_event(sub, Evidence)

    assert penalised == 1 and first(rate_limited, "auto:smartest") == "y"
    assert moded == 1 and degraded.degraded


async def test_after_a_quiet_interval_the_first_change_is_published_at_once(
    bus: InProcessBus, clock: FakeClock
) -> None:
    async with steering(bus, clock) as sub:
        await handled(bus, _obs("x"))
        within = sub.pending
        clock.now += 3600.0  # a whole interval without a publish
        await handled(bus, _obs("x"))
        after = sub.pending
        leading = await next_event(sub, Evidence)

    assert within == 0
    assert after == 1 and {e.model: e.attempts for e in leading.models}["x"] == 2


async def test_allowance_use_that_flips_an_ordering_is_published_at_once(
    bus: InProcessBus, clock: FakeClock
) -> None:
    """x's free allowance is 10 requests: its 9th puts it past the guardrail's threshold
    (80 %), behind y, and the views get that at once; the successes before it wait."""
    allowance = {"catalog": {"free_allowance": {"monthly_requests": 10}}}
    models = (
        ModelConfig.model_validate({"id": "x", **allowance}),
        ModelConfig.model_validate({"id": "y"}),
    )
    async with steering(bus, clock, models) as sub:
        await handled(bus, *[_obs("x") for _ in range(8)])  # 80 %: the multiplier is still 1
        held = sub.pending
        await handled(bus, _obs("x"))  # 90 %: x's multiplier falls to 0.6
        at_once = sub.pending
        flipped = await next_event(sub, Evidence)

    assert held == 0
    assert at_once == 1 and first(flipped, "auto:smartest", models) == "y"


async def test_a_wearing_off_429_penalty_is_published_only_when_it_flips_or_ends(
    bus: InProcessBus, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a 429 the actor checks every second whether the decaying penalty flipped an
    ordering. While it flips nothing (x stays behind y until the penalty is gone) the views
    keep the evidence they have: no publish a second for the whole decay; its end is
    published, x first again. The checks are sent by the test (its timer is an hour)."""
    monkeypatch.setattr(steering_module, "_DECAY_SECONDS", 3600.0)
    actor = SteeringActor(MODELS, (), SteeringConfig(exploration=0), clock=clock)
    async with steering(bus, clock, actor=actor) as sub:
        at = clock.now
        await handled(bus, _obs("x", "failure", 429))
        penalised = await next_event(sub, Evidence)
        decaying = []
        for age in (1.0, 2.0, 150.0, 299.0):  # the default decay is 300 s
            clock.now = at + age
            await actor.ctx.send_self(_DecayCheck())
            await handled(bus)
            decaying.append(sub.pending)
        clock.now = at + 301.0
        await actor.ctx.send_self(_DecayCheck())
        await handled(bus)
        ended = sub.pending
        recovered = await next_event(sub, Evidence)

    assert first(penalised, "auto:smartest") == "y"
    assert decaying == [0, 0, 0, 0]
    assert ended == 1 and first(recovered, "auto:smartest") == "x"
