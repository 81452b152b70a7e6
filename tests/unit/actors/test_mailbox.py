"""Mailbox: FIFO, bounded, putters waiting for room in turn, one consumer."""

from __future__ import annotations

import asyncio

import pytest

from actors.mailbox import Mailbox


async def test_items_come_out_in_order_and_a_full_mailbox_refuses_put_nowait() -> None:
    box: Mailbox[int] = Mailbox(2)
    box.put_nowait(1)
    box.put_nowait(2)
    assert box.full() and len(box) == 2
    with pytest.raises(asyncio.QueueFull):
        box.put_nowait(3)
    assert [await box.get(), await box.get()] == [1, 2]
    assert box.empty()


async def test_a_waiting_consumer_wakes_on_put() -> None:
    box: Mailbox[str] = Mailbox(1)
    got = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    box.put_nowait("hi")
    assert await got == "hi"


async def test_putters_wait_for_room_and_are_served_in_turn() -> None:
    box: Mailbox[int] = Mailbox(1)
    box.put_nowait(0)
    putters = [asyncio.create_task(box.put(i)) for i in (1, 2, 3)]
    await asyncio.sleep(0)
    assert not any(p.done() for p in putters)
    assert [await box.get() for _ in range(4)] == [0, 1, 2, 3]
    await asyncio.gather(*putters)


async def test_a_cancelled_putter_passes_the_room_it_was_woken_for_to_the_next() -> None:
    box: Mailbox[int] = Mailbox(1)
    box.put_nowait(0)
    first = asyncio.create_task(box.put(1))
    second = asyncio.create_task(box.put(2))
    await asyncio.sleep(0)
    assert await box.get() == 0  # wakes the first putter...
    first.cancel()  # ...which is cancelled before it runs
    assert await box.get() == 2
    await second
    with pytest.raises(asyncio.CancelledError):
        await first
    assert box.empty()


async def test_a_second_consumer_is_refused() -> None:
    box: Mailbox[int] = Mailbox(1)
    waiting = asyncio.create_task(box.get())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="one consumer"):
        await box.get()
    box.put_nowait(7)
    assert await waiting == 7
