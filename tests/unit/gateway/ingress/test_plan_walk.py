"""PlanWalk: which planning failures move the walk on to the next model, over a real
in-process bus."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from bus import InProcessBus, NoRespondersError, RequestTimeoutError
from gateway.ingress.dispatch import Budget
from gateway.ingress.plan_walk import PlanWalk
from schemas import (
    AllCircuitsOpenError,
    AllRoutesCoolingError,
    Message,
    RouteCandidate,
    RoutePlan,
    RouteRequest,
    raise_for_reply,
    subjects,
)
from schemas.config import FailoverConfig, ModelConfig


def _models(*ids: str) -> tuple[ModelConfig, ...]:
    return tuple(ModelConfig.model_validate({"id": i}) for i in ids)


class _Asker:
    """Asks each model's owner over the bus, like the app; records whom it asked."""

    def __init__(self, bus: InProcessBus) -> None:
        self.bus = bus
        self.asked: list[str] = []

    async def __call__(self, model: ModelConfig) -> RoutePlan:
        self.asked.append(model.id)
        reply = await self.bus.request(
            subjects.model_route(model.id),
            RouteRequest(model=model.id),
            reply_type=RoutePlan,
            timeout=0.05,
        )
        return raise_for_reply(reply)


def _walk(asker: _Asker, *ids: str, budget: Budget | None = None) -> PlanWalk:
    return PlanWalk(_models(*ids), asker, budget=budget)


def _budget(cooling_wait: float) -> Budget:
    loop = asyncio.get_running_loop()
    return Budget(FailoverConfig(cooling_wait_seconds=cooling_wait), loop.time(), loop.time)


async def _answering(
    bus: InProcessBus, model: str, subscribed: asyncio.Event, *answers: Message
) -> list[float]:
    """Answer ``model``'s plan requests with ``answers`` in turn, setting ``subscribed`` once
    it listens; returns when each request came."""
    loop, asked_at = asyncio.get_running_loop(), []
    async with bus.subscribe(subjects.model_route(model)) as sub:
        subscribed.set()
        for answer in answers:
            req = await anext(aiter(sub))
            asked_at.append(loop.time())
            await req.respond(answer)
    return asked_at


async def test_walk_skips_a_model_that_cannot_plan(bus: InProcessBus) -> None:
    plan = RoutePlan(model="b", candidates=(RouteCandidate(endpoint="b/0", kind="echo"),))
    refusal = AllCircuitsOpenError("open", retry_after=1.0).to_reply()
    async with (
        bus.subscribe(subjects.model_route("a")) as a,
        bus.subscribe(subjects.model_route("b")) as b,
    ):

        async def answer() -> None:
            await (await anext(aiter(a))).respond(refusal)
            await (await anext(aiter(b))).respond(plan)

        asker = _Asker(bus)
        answering = asyncio.create_task(answer())
        got = await _walk(asker, "a", "b").first()
        await answering
    assert got.model == "b"
    assert asker.asked == ["a", "b"]


async def test_walk_does_not_skip_past_a_model_nobody_answers_for(bus: InProcessBus) -> None:
    asker = _Asker(bus)
    with pytest.raises(NoRespondersError):
        await _walk(asker, "a", "b", "c").first()
    assert asker.asked == ["a"]  # the control plane is down: the other models are not asked


async def test_walk_does_not_wait_out_one_decision_timeout_per_model(bus: InProcessBus) -> None:
    asker = _Asker(bus)
    hung = [bus.subscribe(subjects.model_route(m)) for m in "abc"]  # receive, never answer
    async with hung[0], hung[1], hung[2]:
        walk = _walk(asker, "a", "b", "c")
        with pytest.raises(RequestTimeoutError):
            await walk.first()
        assert asker.asked == ["a"]
        with pytest.raises(RequestTimeoutError):
            await walk.next()
    assert asker.asked == ["a", "b"]


PLAN_A = RoutePlan(model="a", candidates=(RouteCandidate(endpoint="a/0", kind="echo"),))


async def test_every_route_cooling_with_the_reset_near_waits_for_it_and_plans_again(
    bus: InProcessBus,
) -> None:
    cooling = AllRoutesCoolingError("cooling", retry_after=0.05).to_reply()
    subscribed = asyncio.Event()
    answering = asyncio.create_task(_answering(bus, "a", subscribed, cooling, PLAN_A))
    await subscribed.wait()
    asker = _Asker(bus)

    got = await _walk(asker, "a", budget=_budget(2.0)).first()

    first, again = await answering
    assert got.model == "a"
    assert asker.asked == ["a", "a"]  # asked again once, at the reset: no polling
    assert again - first >= 0.05


async def test_a_reset_beyond_what_is_left_of_the_cooling_wait_is_answered_at_once(
    bus: InProcessBus,
) -> None:
    cooling = AllRoutesCoolingError("cooling", retry_after=0.05).to_reply()
    subscribed = asyncio.Event()
    answering = asyncio.create_task(_answering(bus, "a", subscribed, cooling, cooling))
    await subscribed.wait()
    asker = _Asker(bus)

    # 0.08 s in all: the first reset is waited for, the second would pass the allowance.
    with pytest.raises(AllRoutesCoolingError) as refused:
        await _walk(asker, "a", budget=_budget(0.08)).first()

    await answering
    assert isinstance(refused.value, AllCircuitsOpenError)  # what the client is shown
    assert refused.value.retry_after == pytest.approx(0.05)
    assert asker.asked == ["a", "a"]


async def test_only_cooling_is_waited_for_and_only_with_a_budget(bus: InProcessBus) -> None:
    open_ = AllCircuitsOpenError("open", retry_after=0.01).to_reply()
    cooling = AllRoutesCoolingError("cooling", retry_after=0.01).to_reply()
    subscribed = asyncio.Event()
    answering = asyncio.create_task(_answering(bus, "a", subscribed, open_, cooling))
    await subscribed.wait()
    asker = _Asker(bus)

    with pytest.raises(AllCircuitsOpenError) as sick:  # open circuits: sickness, no wait
        await _walk(asker, "a", budget=_budget(2.0)).first()
    with pytest.raises(AllRoutesCoolingError):  # explain's walk has no budget
        await _walk(asker, "a").first()

    await answering
    assert type(sick.value) is AllCircuitsOpenError
    assert asker.asked == ["a", "a"]


async def test_a_plan_asked_again_after_a_cooling_wait_is_handed_over_though_cancelled() -> None:
    # The wait sets the request's disconnect watch listening (on_wait); a plan arrives
    # holding a lease, so one asked again after the wait, its request cancelled meanwhile (a
    # client gone), is still handed over, and the cancellation lands after it (whose
    # attempt gives the lease back), not lost to the lease's TTL.
    asked, answer = asyncio.Event(), asyncio.Event()
    leased = RoutePlan(model="m", candidates=(RouteCandidate(endpoint="m:a", kind="echo"),))
    waits: list[str] = []

    async def cooling_then_slow(model: ModelConfig) -> RoutePlan:
        if not waits:
            raise AllRoutesCoolingError("every route cools", retry_after=0.01)
        asked.set()
        await answer.wait()
        return leased

    got: list[RoutePlan] = []
    watch = anyio.CancelScope()  # what the disconnect watch cancels

    async def route() -> None:
        walk = PlanWalk(_models("m"), cooling_then_slow, budget=_budget(5))
        walk.on_wait = lambda: waits.append("listening")
        with watch:
            got.append(await walk.first())
            await anyio.lowlevel.checkpoint()  # where the cancellation lands

    task = asyncio.create_task(route())
    await asked.wait()
    watch.cancel()
    answer.set()
    await task

    assert waits == ["listening"]
    assert got == [leased] and watch.cancelled_caught
