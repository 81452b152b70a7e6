"""A route request waits out a moment without the model's owner (gateway/ingress/owner_wait.py):
asked again until the owner subscribes again, for a bounded time; an owner that does not come
back is noted gone and answered at once from then on, until it answers again."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest

from bus import InProcessBus
from gateway.ingress.owner_wait import OwnerWait
from gateway.ingress.plan_walk import Targeting
from gateway.ingress.request_info import RequestInfo
from schemas import NoRespondersError, RouteCandidate, RoutePlan, RouteRequest, subjects
from schemas.config import GatewayConfig

SUBJECT = subjects.model_route("m")
ASK = RouteRequest(model="m")
WAIT = 5.0  # seconds a test waits for what it expects before it fails
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
    async with asyncio.timeout(WAIT), bus.subscribe(SUBJECT) as sub:
        await (await anext(aiter(sub))).respond(PLAN)  # a request that gave up never comes
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


class _Req:
    """What planning reads of a request: its headers (no ``X-Route-Pin``)."""

    headers: dict[str, str] = {}


async def test_a_routed_request_waits_for_its_models_owner() -> None:
    # The live path: Targeting asks the model's owner, finds none, and waits for it.
    bus = CountingBus()
    config = GatewayConfig.model_validate({"models": [{"id": "m", "route": [{"kind": "echo"}]}]})
    none: Any = None  # steering, rules and secrets: not read by a plain model's plan
    targeting = Targeting(
        bus,
        config,
        secrets=none,
        steering=none,
        rules=none,
        lease_holder="test",
        clock=time.monotonic,
    )
    info = RequestInfo(request_id="r1", surface="chat", stream=False)
    model = targeting.models["m"]
    asking = asyncio.ensure_future(
        targeting.plan_for(model, {"messages": []}, "chat", cast("Any", _Req()), info)
    )
    await bus.missed.wait()  # the owner is not there: the request waits
    async with asyncio.timeout(WAIT), bus.subscribe(SUBJECT) as sub:
        await (await anext(aiter(sub))).respond(PLAN)  # a request that gave up never comes
        plan = await asking

    assert plan == PLAN
