"""Mailbox: an actor's bounded FIFO (one consumer, any producers), as asyncio.Queue behaves."""

from __future__ import annotations

import asyncio

import pytest

from bus import Mailbox


async def test_get_waits_for_a_put_and_items_come_out_in_order() -> None:
    box: Mailbox[int] = Mailbox(4)
    getter = asyncio.create_task(box.get())
    await asyncio.sleep(0)  # one turn of the loop: the getter runs up to its wait
    assert not getter.done()  # empty: the consumer waits
    box.put_nowait(1)
    box.put_nowait(2)
    assert await getter == 1
    assert await box.get() == 2
    assert box.empty() and box.qsize() == 0


async def test_put_nowait_on_a_full_mailbox_raises_queue_full() -> None:
    box: Mailbox[int] = Mailbox(1)
    box.put_nowait(1)
    with pytest.raises(asyncio.QueueFull):
        box.put_nowait(2)


async def test_put_waits_for_room_and_putters_go_in_turn() -> None:
    box: Mailbox[str] = Mailbox(1)
    box.put_nowait("a")
    second = asyncio.create_task(box.put("b"))
    third = asyncio.create_task(box.put("c"))
    await asyncio.sleep(0)  # one turn of the loop: both putters run up to their wait
    assert not second.done() and not third.done()
    assert [await box.get(), await box.get(), await box.get()] == ["a", "b", "c"]
    await asyncio.gather(second, third)


async def test_a_putter_cancelled_after_its_wakeup_passes_the_room_on() -> None:
    box: Mailbox[str] = Mailbox(1)
    box.put_nowait("a")
    woken = asyncio.create_task(box.put("b"))
    waiting = asyncio.create_task(box.put("c"))
    await asyncio.sleep(0)  # one turn of the loop: both putters run up to their wait
    assert await box.get() == "a"  # wakes ``woken``, which is cancelled before it runs
    woken.cancel()
    await asyncio.wait([woken])
    await asyncio.sleep(0)  # a turn of the loop for the putter the room went to
    assert woken.cancelled() and waiting.done()  # nobody stalls on a room nobody took
    assert await box.get() == "c"


async def test_a_cancelled_consumer_leaves_the_mailbox_usable() -> None:
    box: Mailbox[int] = Mailbox(2)
    getter = asyncio.create_task(box.get())
    await asyncio.sleep(0)  # one turn of the loop: cancelled while it waits, not before
    getter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await getter
    box.put_nowait(7)
    assert await box.get() == 7


async def test_a_second_consumer_at_once_raises_runtime_error() -> None:
    box: Mailbox[int] = Mailbox(2)
    first = asyncio.create_task(box.get())
    await asyncio.sleep(0)  # one turn of the loop: the first consumer waits now
    with pytest.raises(RuntimeError, match="one consumer"):
        await box.get()
    box.put_nowait(1)
    assert await first == 1


async def test_take_hands_over_the_oldest_item_at_once_and_wakes_a_putter() -> None:
    box: Mailbox[str] = Mailbox(1)
    with pytest.raises(IndexError):
        box.take()  # only for a consumer that saw an item there
    box.put_nowait("a")
    putter = asyncio.create_task(box.put("b"))
    await asyncio.sleep(0)  # one turn of the loop: the putter runs up to its wait
    assert not putter.done()  # full: the producer waits for room
    assert box.take() == "a"  # no coroutine, no wait
    await putter  # the room went to the waiting producer
    assert box.take() == "b" and box.empty()
