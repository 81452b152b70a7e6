"""The pipeline's admission step (``Inference._routed``): a request cancelled while its
limits' verdict is awaited (the server stopping, say) gives its first plan's leases back, as a
refusal does; the plan was asked before the verdict, so nothing else would."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.ingress.pipeline import Inference
from gateway.ingress.request_info import RequestInfo
from schemas import RateLimitedError

PLAN: Any = object()


class _Walk:
    budget_for: Any = None

    async def first(self) -> Any:
        return PLAN


class _Ticket:
    def __init__(self, verdict: BaseException | None) -> None:
        self.asked = asyncio.Event()
        self._verdict = verdict

    async def decide(self) -> None:
        self.asked.set()
        if self._verdict is not None:
            raise self._verdict
        await asyncio.Event().wait()  # the owner has not answered yet


class _Dispatcher:
    def __init__(self) -> None:
        self.released: list[Any] = []

    def budget(self, *args: Any) -> None:
        return None

    async def release_plan(self, info: RequestInfo, plan: Any) -> None:
        await asyncio.sleep(0)  # awaits, as the real one publishes: a shield must hold it
        self.released.append(plan)


def _routed(dispatcher: _Dispatcher, ticket: _Ticket) -> Any:
    inference: Any = SimpleNamespace(_dispatcher=dispatcher)
    info = RequestInfo(request_id="r1", surface="chat", stream=False)
    none: Any = None
    return Inference._routed(inference, none, none, {}, {}, "m", info, _Walk(), ticket)  # type: ignore[arg-type]


async def test_a_request_cancelled_awaiting_its_verdict_gives_its_plans_leases_back() -> None:
    dispatcher, ticket = _Dispatcher(), _Ticket(None)
    task = asyncio.ensure_future(_routed(dispatcher, ticket))
    await ticket.asked.wait()

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert dispatcher.released == [PLAN]  # before: never given back


async def test_a_refused_request_gives_its_plans_leases_back() -> None:
    dispatcher = _Dispatcher()

    with pytest.raises(RateLimitedError):
        await _routed(dispatcher, _Ticket(RateLimitedError("rpm", retry_after=1.0)))

    assert dispatcher.released == [PLAN]
