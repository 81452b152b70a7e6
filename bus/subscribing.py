"""Subscribing: the in-process bus's subscription for the length of an ``async with``."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from bus.inprocess import BufferedSubscription


class Subscribing(AbstractAsyncContextManager["BufferedSubscription"]):
    """Owns one subscription while entered: ``add`` makes it on entry (raising what it
    raises), ``remove`` ends it on exit."""

    __slots__ = ("_add", "_remove", "_sub")

    def __init__(
        self,
        add: Callable[[], BufferedSubscription],
        remove: Callable[[BufferedSubscription], None],
    ) -> None:
        self._add = add
        self._remove = remove
        self._sub: BufferedSubscription | None = None

    async def __aenter__(self) -> BufferedSubscription:
        self._sub = self._add()
        return self._sub

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._sub is not None:
            self._remove(self._sub)
            self._sub = None
