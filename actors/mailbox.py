"""Mailbox: an actor's bounded FIFO, taken by its one loop task.

What ``asyncio.Queue`` does for an actor, at a fraction of the calls: every message an actor
handles passes through here, and the queue's ten Python calls per message (put, get, size and
waiter checks) were a measurable share of a request's CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Mailbox(Generic[T]):
    """Owns the queued items, the consumer's waiter and the waiting putters.

    ``put_nowait`` raises ``asyncio.QueueFull`` past ``maxsize`` items; ``put`` waits for room
    (putters served first come, first served); ``get`` waits for an item and raises
    RuntimeError when a second task waits at the same time (one consumer).
    """

    __slots__ = ("_getter", "_items", "_putters", "maxsize")

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._items: deque[T] = deque()
        self._getter: asyncio.Future[None] | None = None
        self._putters: deque[asyncio.Future[None]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        """True when no item is queued."""
        return not self._items

    def full(self) -> bool:
        """True when ``put_nowait`` would raise QueueFull."""
        return len(self._items) >= self.maxsize

    def put_nowait(self, item: T) -> None:
        """Queue ``item``. Raises asyncio.QueueFull when full."""
        if len(self._items) >= self.maxsize:
            raise asyncio.QueueFull
        self._items.append(item)
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)

    async def put(self, item: T) -> None:
        """Queue ``item``, first waiting for room."""
        while len(self._items) >= self.maxsize:
            putter = asyncio.get_running_loop().create_future()
            self._putters.append(putter)
            try:
                await putter
            except BaseException:
                putter.cancel()
                with contextlib.suppress(ValueError):
                    self._putters.remove(putter)
                if not self.full() and not putter.cancelled():
                    self._wake_putter()  # the room it was woken for goes to the next one
                raise
        self.put_nowait(item)

    async def get(self) -> T:
        """The oldest item, waiting for one. Raises RuntimeError for a second consumer."""
        items = self._items
        while not items:
            if self._getter is not None:
                raise RuntimeError("a mailbox has one consumer")
            self._getter = asyncio.get_running_loop().create_future()
            try:
                await self._getter
            finally:
                self._getter = None
        item = items.popleft()
        if self._putters:
            self._wake_putter()
        return item

    def _wake_putter(self) -> None:
        while self._putters:
            putter = self._putters.popleft()
            if not putter.done():
                putter.set_result(None)
                return
