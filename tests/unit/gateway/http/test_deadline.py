"""deadline: a block bounded in time on the loop's one shared timer, leaving as
asyncio.timeout does (TimeoutError when it passes, CancelledError for another's cancel)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.http import deadline as deadline_module
from gateway.http.deadline import TICK, deadline


def _wheel(loop: asyncio.AbstractEventLoop) -> deadline_module._Wheel:
    return deadline_module._wheel_of(loop)


async def test_a_block_that_overruns_leaves_by_timeout_error_never_before_its_deadline() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(TimeoutError):
        with deadline(0.05) as scope:
            await asyncio.Event().wait()
    assert scope.expired
    assert loop.time() - started >= 0.05


async def test_a_block_done_in_time_leaves_nothing_behind_and_the_timer_stops() -> None:
    loop = asyncio.get_running_loop()
    with deadline(0.02) as scope:
        await asyncio.sleep(0)  # the block suspends, and is done long before its deadline
    assert not scope.expired
    # Past the deadline the task is not cancelled, and once its tick has gone by no
    # deadline is pending and the shared timer is no longer set.
    await asyncio.sleep(0.02 + 3 * TICK)
    assert _wheel(loop).pending == 0
    assert not _wheel(loop).armed


async def test_a_cancellation_from_elsewhere_leaves_as_cancelled_error() -> None:
    entered = asyncio.Event()

    async def bounded() -> None:
        with deadline(10):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(bounded())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_inner_deadline_passing_leaves_the_outer_block_running() -> None:
    with deadline(10) as outer:
        with pytest.raises(TimeoutError):
            with deadline(0.02):
                await asyncio.Event().wait()
        await asyncio.sleep(0)  # no cancellation left pending on the task
    assert not outer.expired


async def test_the_outer_deadline_passing_inside_an_inner_block_is_the_outer_ones() -> None:
    with pytest.raises(TimeoutError):
        with deadline(0.02) as outer:
            with deadline(10) as inner:
                await asyncio.Event().wait()
    assert outer.expired and not inner.expired


async def test_deadlines_of_many_lengths_pass_in_their_order() -> None:
    passed: list[int] = []

    async def bounded(n: int) -> None:
        with pytest.raises(TimeoutError):
            # Five ticks apart: the tasks enter their deadlines one after another, and on a
            # loaded machine the process may be paused between two of them for a tick or so.
            with deadline(0.05 * n):
                await asyncio.Event().wait()
        passed.append(n)

    lengths = [7, 1, 5, 3, 9, 2, 8, 4, 6]
    await asyncio.gather(*(bounded(n) for n in lengths))
    assert passed == sorted(lengths)


def test_a_deadline_outside_a_task_is_refused() -> None:
    loop = asyncio.new_event_loop()
    refused: list[RuntimeError] = []

    def enter() -> None:  # a plain callback of the loop: no task
        try:
            with deadline(1):
                pass
        except RuntimeError as exc:
            refused.append(exc)
        loop.stop()

    try:
        loop.call_soon(enter)
        loop.run_forever()
    finally:
        loop.close()
    assert refused and "task" in str(refused[0])
