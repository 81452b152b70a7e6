"""shielded: a coroutine finishes however its caller is cancelled, suspending or not."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.ingress.settling import shielded


async def test_a_coroutine_that_never_suspends_gives_its_result_and_its_error() -> None:
    async def answer() -> int:
        return 42

    async def refuse() -> int:
        raise ValueError("no")

    assert await shielded(answer()) == 42
    with pytest.raises(ValueError, match="no"):
        await shielded(refuse())


async def test_a_suspending_coroutine_finishes_when_its_caller_is_cancelled_meanwhile() -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    finished: list[str] = []

    async def publish() -> str:
        entered.set()
        await release.wait()
        await asyncio.sleep(0)  # a second suspension, also shielded
        finished.append("published")
        return "done"

    results: list[str] = []
    with anyio.CancelScope() as scope:

        async def caller() -> None:
            results.append(await shielded(publish()))
            await anyio.sleep_forever()  # the cancellation lands here, after the publish

        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
            await entered.wait()
            scope.cancel()
            release.set()
    assert finished == ["published"]
    assert results == ["done"]


async def test_an_error_thrown_into_the_rest_reaches_the_coroutine() -> None:
    caught: list[str] = []

    async def publish() -> None:
        try:
            await asyncio.sleep(3600)  # a wait that only the cancellation ends
        except asyncio.CancelledError:
            caught.append("cancelled")
            raise

    task = asyncio.create_task(shielded(publish()))
    await asyncio.sleep(0)  # the task reaches the sleep
    task.cancel()  # native cancellation is not anyio's: a shield does not hold it back
    with pytest.raises(asyncio.CancelledError):
        await task
    assert caught == ["cancelled"]
