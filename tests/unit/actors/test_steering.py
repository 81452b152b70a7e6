"""The SteeringActor's evidence publishing on the in-process bus: a change that flips an
ordering, a model's health or the mode reaches the views at once, whatever the interval;
other changes wait for the interval's end, or go at once after a quiet interval (leading
edge). The interval is set far beyond the test and the clock is a fake one, so what is
published at once is told apart from what waits without sleeping: a SteeringGet answered
after the change means the actor handled it, and an evidence publish made while handling
it is then already queued for the test's subscription."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from actors import ChildSpec, Supervisor
from actors.steering import SteeringActor
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

    from bus import InProcessBus

MODELS = tuple(ModelConfig.model_validate({"id": m}) for m in ("x", "y"))


@asynccontextmanager
async def steering(bus: InProcessBus, clock: FakeClock) -> AsyncIterator[BufferedSubscription]:
    """A SteeringActor publishing at most once an hour but for what flips; yields the
    evidence subscription, past the evidence published at start."""
    actor = SteeringActor(MODELS, (), SteeringConfig(exploration=0), clock=clock)
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


def first(evidence: Evidence, name: str) -> str:
    """The model an ingress holding ``evidence`` routes ``name`` to first."""
    book = book_from(MODELS, SteeringState(exploration=0), {}, evidence)
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
