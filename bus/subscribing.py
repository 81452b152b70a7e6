"""Subscribing: the in-process bus's subscription for the length of an ``async with``, and
the subject rules both buses share (NATS's): what a subscription, a queue group and a literal
subject may be, and which subjects a pattern matches."""

from __future__ import annotations

import asyncio
import re
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Self

if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Callable
    from types import TracebackType

    from bus.inprocess import BufferedSubscription
    from bus.protocol import Envelope, Sink

_BAD_CHARS = re.compile(r"\s")


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


def check_pattern(pattern: str) -> None:
    """Validate a subscription subject (``*``/``>`` allowed). Raises ValueError."""
    if not pattern or _BAD_CHARS.search(pattern):
        raise ValueError(f"invalid subject {pattern!r}: empty or contains whitespace")
    toks = pattern.split(".")
    for i, tok in enumerate(toks):
        if not tok:
            raise ValueError(f"invalid subject {pattern!r}: empty token")
        if tok == ">" and i != len(toks) - 1:
            raise ValueError(f"invalid subject {pattern!r}: '>' must be the last token")
        if tok not in ("*", ">") and ("*" in tok or ">" in tok):
            raise ValueError(f"invalid subject {pattern!r}: a wildcard must be a whole token")


def check_queue(queue: str | None) -> None:
    """Validate a queue group name (None: no group). Raises ValueError."""
    if queue is not None and (not queue or _BAD_CHARS.search(queue)):
        raise ValueError(f"invalid queue group {queue!r}: empty or contains whitespace")


class SubscriptionConsumer:
    """The consumer's half of a ``bus.inprocess.BufferedSubscription`` (which owns the
    state): iterating it or feeding a sink, and closing it. The delivering half stays in the
    publisher's module."""

    __slots__ = (
        "_closed",
        "_items",
        "_sink",
        "_tokens",
        "_waiter",
        "dropped",
        "pending_limit",
        "queue",
        "subject",
    )

    subject: str
    queue: str | None
    _items: deque[Envelope]
    _waiter: asyncio.Future[None] | None
    _sink: Sink | None
    _closed: bool

    def close(self) -> None:
        """End iteration; queued messages are discarded."""
        self._closed = True
        self._items.clear()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Envelope:
        if self._sink is not None:
            raise RuntimeError(f"subscription {self.subject!r} is already being fed")
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._items:
                return self._items.popleft()
            if self._waiter is not None:
                raise RuntimeError(f"subscription {self.subject!r} is already being iterated")
            # A bare future, not a task: waking the consumer costs one loop callback.
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def feed(self, sink: Sink) -> None:
        """Put every message into ``sink``, in order, until the subscription ends; never
        loses one. While ``sink`` has room and nothing older waits here, ``deliver`` puts a
        message straight in (no task switch); else it queues here and is put once ``sink``
        has room (waiting: backpressure, as a consumer's ``put`` would). Raises RuntimeError
        when the subscription is already being iterated or fed."""
        if self._waiter is not None or self._sink is not None:
            raise RuntimeError(f"subscription {self.subject!r} is already being iterated")
        self._sink = sink
        items = self._items
        try:
            while not self._closed:
                if items:
                    env = items[0]  # stays first while put waits: later ones queue behind it
                    await sink.put(env)
                    if items and items[0] is env:  # else close() discarded the queue meanwhile
                        items.popleft()
                    continue
                self._waiter = asyncio.get_running_loop().create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
        finally:
            self._sink = None

    def __repr__(self) -> str:
        return f"BufferedSubscription({self.subject!r}, queue={self.queue!r})"


def check_subject(subject: str) -> None:
    """Validate a literal subject (publish/request). Raises ValueError naming the problem."""
    if not subject or _BAD_CHARS.search(subject):
        raise ValueError(f"invalid subject {subject!r}: empty or contains whitespace")
    for tok in subject.split("."):
        if not tok or "*" in tok or ">" in tok:
            raise ValueError(f"invalid subject {subject!r}: empty token or wildcard")


def subject_matches(pattern: str, subject: str) -> bool:
    """True when literal ``subject`` matches ``pattern`` (``*`` one token, ``>`` one or more)."""
    return tokens_match(tuple(pattern.split(".")), subject.split("."))


def tokens_match(pattern: tuple[str, ...], subject: list[str]) -> bool:
    """:func:`subject_matches` on subjects already split into tokens."""
    n = len(subject)
    for i, tok in enumerate(pattern):
        if tok == ">":
            return n > i
        if i >= n or (tok != "*" and tok != subject[i]):
            return False
    return len(pattern) == n
