"""A hedge race stopped from outside (its request cancelled: the client went away) after one
side already succeeded discards that side's result, which nobody will read: a stream that
won while the race waited for the loser to stop would otherwise keep its capacity lease, its
upstream connection and its observation until their timeouts. A race that ends as usual
discards nothing more than the late loser it always did."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import anyio
import pytest

from gateway.ingress.hedging import Raced, race

if TYPE_CHECKING:
    from gateway.ingress.hedging import Declined
    from schemas import UpstreamError


class _Sides:
    """A primary answering once ``answer`` is set, and a backup that waits forever and takes
    until ``let_go`` to stop once cancelled (closing its upstream connection, say)."""

    def __init__(self) -> None:
        self.answer = anyio.Event()
        self.stopping = anyio.Event()
        self.let_go = anyio.Event()
        self.discarded: list[str] = []

    async def primary(self, flag: Declined) -> str | UpstreamError:
        await self.answer.wait()
        return "primary's stream"

    async def backup(self, flag: Declined) -> str | UpstreamError:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.stopping.set()
            await self.let_go.wait()
            raise
        return "never"

    async def discard(self, result: str) -> None:
        self.discarded.append(result)


async def test_a_race_stopped_while_it_stops_the_loser_discards_the_winner() -> None:
    sides = _Sides()
    outcome: list[Raced[str]] = []

    async def run() -> None:
        outcome.append(await race(sides.primary, sides.backup, 0.0, sides.discard))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await anyio.wait_all_tasks_blocked()  # the hedge fired: both sides run
            sides.answer.set()  # the primary wins; the race stops the backup
            await sides.stopping.wait()
            tg.cancel_scope.cancel()  # the client goes away meanwhile
            sides.let_go.set()

    assert outcome == []  # the caller never got the winner ...
    assert sides.discarded == ["primary's stream"]  # ... so the race discarded it


@pytest.mark.parametrize("stopped_late", [False, True])
async def test_a_race_that_ends_hands_its_winner_over_and_discards_nothing_else(
    stopped_late: bool,
) -> None:
    sides = _Sides()
    sides.let_go.set()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            result: list[Raced[str]] = []

            async def run() -> None:
                result.append(await race(sides.primary, sides.backup, 0.0, sides.discard))

            tg.start_soon(run)
            await anyio.wait_all_tasks_blocked()
            sides.answer.set()
            if stopped_late:
                await sides.stopping.wait()
    assert [(r.winner, r.results) for r in result] == [(0, ["primary's stream", None])]
    assert sides.discarded == []
