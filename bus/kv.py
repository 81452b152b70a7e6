"""Key-value buckets with compare-and-set by revision: the shape both buses give them, and
the in-memory bucket of the in-process bus.

A bucket maps keys to values; every write gets a revision, strictly increasing within the
bucket, and a write conditioned on a revision (:meth:`KeyValue.update`, a conditional
:meth:`KeyValue.delete`) lands only while the key still has it. That is the fencing primitive
the actor hosts build their leases on. With a ``ttl``, a key no write refreshed for ``ttl``
seconds is gone (heartbeats). Keys may be any string: both buses escape them the same way
(:func:`kv_key`) into what JetStream accepts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from bus.errors import BusClosedError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable
    from contextlib import AbstractAsyncContextManager

logger = logging.getLogger(__name__)

WATCH_LIMIT = 4096  # changes a watcher may have queued; past it, new ones are dropped (logged)

_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class KvConflictError(Exception):
    """A conditional write found the key at another revision (or present, for ``create``)."""


@dataclass(frozen=True, slots=True)
class KvEntry:
    """One key's current value and the revision of the write that set it; from a watch,
    ``deleted`` marks a deletion (``value`` is then empty)."""

    key: str
    value: bytes
    revision: int
    deleted: bool = False


class KeyValue(Protocol):
    """One bucket. Raises BusClosedError when the bus is gone or the bucket unreachable."""

    bucket: str

    async def get(self, key: str) -> KvEntry | None:
        """The key's entry, or None when it is absent, deleted or expired."""
        ...

    async def put(self, key: str, value: bytes) -> int:
        """Set ``key`` whatever its revision; returns the new revision."""
        ...

    async def create(self, key: str, value: bytes) -> int:
        """Set ``key`` only if it is absent; returns the new revision. Raises KvConflictError."""
        ...

    async def update(self, key: str, value: bytes, *, revision: int) -> int:
        """Set ``key`` only while its revision is ``revision``; returns the new revision.
        Raises KvConflictError."""
        ...

    async def delete(self, key: str, *, revision: int | None = None) -> None:
        """Remove ``key`` (only while its revision is ``revision``, when given); an absent
        key is fine without a revision. Raises KvConflictError."""
        ...

    async def keys(self) -> list[str]:
        """The keys present now (not deleted, not expired), in no particular order."""
        ...

    def watch(self) -> AbstractAsyncContextManager[AsyncIterator[KvEntry]]:
        """For an ``async with``: iterate each present key's entry, then later writes and
        deletions, in order. A key's entries come newest-wins: on NATS the bucket keeps one
        message a key, so a write that a later write to the same key replaced before it
        reached the watcher is not reported (the later one is). A key lapsing by TTL is not
        reported."""
        ...


def kv_key(raw: str) -> str:
    """Escape ``raw`` into a JetStream key: ``[A-Za-z0-9_-]`` stay, every other byte is
    ``=hh``. Reversible (:func:`kv_unkey`)."""
    if raw and all(ch in _SAFE for ch in raw):
        return raw
    return "".join(ch if ch in _SAFE else "".join(f"={b:02x}" for b in ch.encode()) for ch in raw)


def kv_unkey(key: str) -> str:
    """Invert :func:`kv_key`. Raises ValueError on a malformed escape."""
    raw = bytearray()
    i = 0
    while i < len(key):
        if key[i] == "=":
            raw.append(int(key[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.extend(key[i].encode())
            i += 1
    return raw.decode()


class MemoryKeyValue:
    """A bucket in this process's memory, with JetStream's CAS semantics; ``clock``
    (monotonic seconds) decides TTL expiry; revisions count per bucket, as a JetStream
    stream's sequence does."""

    def __init__(
        self,
        bucket: str,
        *,
        ttl: float | None,
        clock: Callable[[], float] = time.monotonic,
        closed: Callable[[], bool] = lambda: False,
    ) -> None:
        self.bucket = bucket
        self.ttl = ttl
        self._revisions = itertools.count(1)
        self._clock = clock
        self._closed = closed
        self._entries: dict[str, tuple[bytes, int, float]] = {}  # key -> value, rev, written
        self._watchers: set[asyncio.Queue[KvEntry]] = set()

    async def get(self, key: str) -> KvEntry | None:
        """See :meth:`KeyValue.get`."""
        self._check()
        found = self._live(key)
        return None if found is None else KvEntry(key, found[0], found[1])

    async def put(self, key: str, value: bytes) -> int:
        """See :meth:`KeyValue.put`."""
        self._check()
        return self._write(key, value)

    async def create(self, key: str, value: bytes) -> int:
        """See :meth:`KeyValue.create`."""
        self._check()
        if self._live(key) is not None:
            raise KvConflictError(f"{self.bucket}/{key} exists")
        return self._write(key, value)

    async def update(self, key: str, value: bytes, *, revision: int) -> int:
        """See :meth:`KeyValue.update`."""
        self._check()
        found = self._live(key)
        if found is None or found[1] != revision:
            raise KvConflictError(f"{self.bucket}/{key} is not at revision {revision}")
        return self._write(key, value)

    async def delete(self, key: str, *, revision: int | None = None) -> None:
        """See :meth:`KeyValue.delete`."""
        self._check()
        found = self._live(key)
        if revision is not None and (found is None or found[1] != revision):
            raise KvConflictError(f"{self.bucket}/{key} is not at revision {revision}")
        if self._entries.pop(key, None) is not None:
            self._notify(KvEntry(key, b"", next(self._revisions), deleted=True))

    async def keys(self) -> list[str]:
        """See :meth:`KeyValue.keys`."""
        self._check()
        return [k for k in list(self._entries) if self._live(k) is not None]

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[AsyncIterator[KvEntry]]:
        """See :meth:`KeyValue.watch`. Raises BusClosedError."""
        self._check()
        changes: asyncio.Queue[KvEntry] = asyncio.Queue(maxsize=WATCH_LIMIT)
        for key in list(self._entries):
            found = self._live(key)
            if found is not None:
                changes.put_nowait(KvEntry(key, found[0], found[1]))
        self._watchers.add(changes)

        async def iterate() -> AsyncIterator[KvEntry]:
            while True:
                yield await changes.get()

        try:
            yield iterate()
        finally:
            self._watchers.discard(changes)

    def _notify(self, entry: KvEntry) -> None:
        for changes in self._watchers:
            try:
                changes.put_nowait(entry)
            except asyncio.QueueFull:
                logger.warning("key-value watcher of %s is full: dropped a change", self.bucket)

    def _live(self, key: str) -> tuple[bytes, int, float] | None:
        found = self._entries.get(key)
        if found is not None and self.ttl is not None and self._clock() - found[2] >= self.ttl:
            del self._entries[key]
            return None
        return found

    def _write(self, key: str, value: bytes) -> int:
        rev = next(self._revisions)
        self._entries[key] = (bytes(value), rev, self._clock())
        if self._watchers:
            self._notify(KvEntry(key, bytes(value), rev))
        return rev

    def _check(self) -> None:
        if self._closed():
            raise BusClosedError("bus is closed")
