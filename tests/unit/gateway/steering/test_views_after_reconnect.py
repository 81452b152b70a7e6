"""An ingress's steering and rules views after its NATS server restarted.

What the owners published while the connection was down never arrives: once the connection
is back, each view asks its owner for the whole picture again, so a chain or a rule set
changed meanwhile is routed by, not the one from before the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import pytest

from bus import NatsBus
from gateway.steering.rules import RulesView
from gateway.steering.view import SteeringView
from schemas import (
    ChainEntry,
    ChainState,
    SteeringSnapshot,
    SteeringState,
    subjects,
)
from schemas.config import GatewayConfig
from schemas.rules import RulesState
from tests.fixtures.nats import start_nats_server

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from schemas import Message

pytestmark = pytest.mark.nats

WAIT_S = 10.0


def _snapshot(model: str) -> SteeringSnapshot:
    chain = ChainState(name="kx", models=(ChainEntry(model=model),))
    return SteeringSnapshot(state=SteeringState(chains=("kx",)), chains=(chain,))


async def _answer(
    bus: NatsBus, subject: str, reply: Callable[[], Message], live: asyncio.Event
) -> None:
    async with bus.subscribe(subject) as sub:  # live at the server once entered
        live.set()
        async for env in sub:
            await env.respond(reply())


async def _until(check: Callable[[], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not check():  # noqa: ASYNC110 (the views have no event to wait on)
            await asyncio.sleep(0.02)


class _Owners:
    """What the owners answer a get with now."""

    model = "m"
    rules = 1


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_views_ask_their_owners_again_once_the_connection_is_back(tmp_path: Path) -> None:
    config = GatewayConfig.model_validate({"models": [{"id": "m"}, {"id": "m2"}]})
    store = tmp_path / "nats"
    now = _Owners()
    with contextlib.ExitStack() as server:
        url = server.enter_context(start_nats_server(store))
        async with contextlib.AsyncExitStack() as stack:
            owner = await NatsBus.connect(url, name="owner")
            stack.push_async_callback(owner.aclose)
            ingress = await NatsBus.connect(url, name="ingress")
            stack.push_async_callback(ingress.aclose)
            live: list[asyncio.Event] = []
            for subject, reply in (
                (subjects.STEERING_GET, lambda: _snapshot(now.model)),
                (subjects.RULES_GET, lambda: RulesState(version=now.rules)),
            ):
                live.append(ready := asyncio.Event())
                answering = asyncio.create_task(_answer(owner, subject, reply, ready))
                stack.push_async_callback(_stop, answering)
            steering, rules = SteeringView(ingress, config), RulesView(ingress)
            stack.push_async_callback(steering.aclose)
            stack.push_async_callback(rules.aclose)
            async with asyncio.timeout(WAIT_S):
                for ready in live:
                    await ready.wait()
            await steering.start()
            await rules.start()
            assert steering.book.chains["kx"].models == (ChainEntry(model="m"),)
            assert rules.state == RulesState(version=1)

            server.close()  # the server stops; the owners change meanwhile, no event heard
            now.model, now.rules = "m2", 2
            server.enter_context(start_nats_server(store, port=int(url.rsplit(":", 1)[1])))

            await _until(lambda: rules.state == RulesState(version=2))
            await _until(lambda: steering.book.chains["kx"].models == (ChainEntry(model="m2"),))
