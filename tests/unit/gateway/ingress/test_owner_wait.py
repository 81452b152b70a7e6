"""A route request waits out a moment without the model's owner (gateway/ingress/owner_wait.py):
asked again until the owner subscribes again, for a bounded time; an owner that does not come
back is noted gone and answered at once from then on, until it answers again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bus import InProcessBus
from gateway.ingress.owner_wait import OwnerWait
from schemas import NoRespondersError, RouteCandidate, RoutePlan, RouteRequest, subjects

SUBJECT = subjects.model_route("m")
ASK = RouteRequest(model="m")
PLAN = RoutePlan(model="m", candidates=(RouteCandidate(endpoint="m/0", kind="echo"),))


class CountingBus(InProcessBus):
    """Counts route requests; ``missed`` is set when one finds no subscriber."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0
        self.missed = asyncio.Event()

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        self.asked += 1
        try:
            return await super().request(*args, **kwargs)
        except NoRespondersError:
            self.missed.set()
            raise


async def test_the_owner_back_in_time_answers_the_request() -> None:
    bus = CountingBus()
    owners = OwnerWait(bus, wait=5.0, every=0.01)
    asking = asyncio.create_task(owners.ask_again(SUBJECT, ASK, timeout=5.0))
    await bus.missed.wait()  # asked again while nobody owns the model
    async with bus.subscribe(SUBJECT) as sub:
        await (await anext(aiter(sub))).respond(PLAN)
        plan = await asking

    assert plan == PLAN
    assert bus.asked >= 2 and not owners.gone


async def test_an_owner_not_back_in_time_is_gone_and_then_answered_at_once() -> None:
    bus = CountingBus()
    owners = OwnerWait(bus, wait=0.05, every=0.01)
    with pytest.raises(NoRespondersError):
        await owners.ask_again(SUBJECT, ASK, timeout=5.0)
    asked = bus.asked

    with pytest.raises(NoRespondersError):
        await owners.ask_again(SUBJECT, ASK, timeout=5.0)

    assert owners.gone == {SUBJECT}
    assert bus.asked == asked  # not asked again: an owner down costs one wait, not one each


async def test_an_owner_that_answers_again_is_waited_for_again() -> None:
    bus = CountingBus()
    owners = OwnerWait(bus, wait=0.05, every=0.01)
    owners.gone.add(SUBJECT)

    owners.answered(SUBJECT)

    assert not owners.gone


async def test_the_wait_never_outlasts_the_decision_timeout() -> None:
    owners = OwnerWait(CountingBus(), wait=60.0, every=0.01)

    async with asyncio.timeout(5.0):  # bounded by the 0.05 s timeout, not the 60 s wait
        with pytest.raises(NoRespondersError):
            await owners.ask_again(SUBJECT, ASK, timeout=0.05)

    assert owners.gone == {SUBJECT}
