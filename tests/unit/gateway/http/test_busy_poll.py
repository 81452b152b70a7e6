"""Busy polling (gateway/http/busy_poll.py): a hold keeps the loop polling for its window, then
the loop sleeps again; holds within a window extend it; the window's bounds."""

from __future__ import annotations

import asyncio

import pytest

from gateway.http import busy_poll
from gateway.http.busy_poll import BusyPoll


async def _idle(seconds: float) -> None:
    """Let the loop have nothing to do but a timer for ``seconds``."""
    done = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, done.set)
    await done.wait()


async def test_a_hold_keeps_an_idle_loop_polling_until_its_window_ends_then_it_sleeps() -> None:
    poller = BusyPoll(asyncio.get_running_loop(), 3_000)
    poller.hold()
    await _idle(0.03)  # well past the window
    polled = poller.spins
    # Nothing else ran: each of those iterations was a poll with a zero timeout, not a sleep.
    assert polled > 1
    assert not poller.spinning
    await _idle(0.03)
    assert poller.spins == polled  # an idle loop sleeps again once the window is over


async def test_without_a_hold_the_loop_never_polls() -> None:
    poller = BusyPoll(asyncio.get_running_loop(), 3_000)
    await _idle(0.01)
    assert poller.spins == 0
    assert not poller.spinning


async def test_holds_within_a_window_extend_it_on_one_callback() -> None:
    poller = BusyPoll(asyncio.get_running_loop(), 3_000)
    poller.hold()
    poller.hold()
    await asyncio.sleep(0)  # one loop iteration
    assert poller.spins == 1  # two callbacks would have polled twice
    assert poller.holds == 2
    await _idle(0.02)
    assert not poller.spinning


async def test_install_makes_the_loops_poller_and_uninstall_forgets_only_its_own() -> None:
    loop = asyncio.get_running_loop()
    assert busy_poll.install(loop, 0) is None
    assert busy_poll.pollers.get(loop) is None
    mine = busy_poll.install(loop, 200)
    try:
        assert mine is not None and busy_poll.pollers.get(loop) is mine
        assert mine.window == pytest.approx(0.0002)
        busy_poll.uninstall(BusyPoll(loop, 200))  # another poller: not the loop's
        assert busy_poll.pollers.get(loop) is mine
    finally:
        busy_poll.uninstall(mine)
    assert busy_poll.pollers.get(loop) is None


async def test_servers_sharing_a_loop_or_a_process_keep_their_pollers() -> None:
    loop = asyncio.get_running_loop()
    first = busy_poll.install(loop, 200)
    try:
        assert busy_poll.install(loop, 0) is None  # a server that does not poll
        assert busy_poll.pollers.get(loop) is first
        second = busy_poll.install(loop, 300)
        busy_poll.uninstall(first)
        assert busy_poll.pollers.get(loop) is second  # the one still serving holds the loop now
        other = asyncio.new_event_loop()  # another thread's loop: none of this one's
        try:
            assert busy_poll.pollers.get(other) is None
        finally:
            other.close()
        busy_poll.uninstall(second)
    finally:
        busy_poll.uninstall(first)
    assert busy_poll.pollers.get(loop) is None


@pytest.mark.parametrize("window_us", [-1, 10_001])
async def test_a_window_out_of_bounds_is_refused(window_us: int) -> None:
    with pytest.raises(ValueError, match="0 to 10000"):
        busy_poll.install(asyncio.get_running_loop(), window_us)
    assert busy_poll.pollers.get(asyncio.get_running_loop()) is None
