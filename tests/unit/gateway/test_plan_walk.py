"""PlanWalk: which planning failures move the walk on to the next model, over a real
in-process bus."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from bus import InProcessBus, NoRespondersError, RequestTimeoutError
from gateway.ingress.plan_walk import PlanWalk
from schemas import (
    AllCircuitsOpenError,
    RouteCandidate,
    RoutePlan,
    RouteRequest,
    raise_for_reply,
    subjects,
)
from schemas.config import ModelConfig

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


@pytest.fixture
async def bus() -> AsyncIterator[InProcessBus]:
    b = InProcessBus()
    yield b
    await b.aclose()


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


def _walk(asker: _Asker, *ids: str) -> PlanWalk:
    return PlanWalk(_models(*ids), asker)


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
