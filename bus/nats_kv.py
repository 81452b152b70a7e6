"""NatsKeyValue: a JetStream key-value bucket as a ``bus.kv.KeyValue``, over nats-py.

``NatsBus.key_value`` opens it; with ``nats_bus.py`` the only module that imports ``nats``.
Every nats-py failure of a bucket read or write becomes ``KvConflictError`` (a conditional
write lost its race), ValueError (a key JetStream refuses) or ``BusClosedError`` here.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import nats.errors
import nats.js.errors

from bus.errors import BusClosedError
from bus.kv import KvConflictError, KvEntry, kv_key, kv_unkey

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from nats.js import JetStreamContext
    from nats.js.kv import KeyValue as _NatsKeyValue

_KV_DEL, _KV_PURGE = "DEL", "PURGE"  # a watched entry's operation header
# JetStream's "wrong last sequence" codes: a conditional write lost its race.
_WRONG_LAST_SEQUENCE = (10071, 10164)


class NatsKeyValue:
    """A JetStream key-value bucket as a ``bus.kv.KeyValue``: keys escaped by ``kv_key``,
    revisions are the bucket stream's sequence numbers. Raises KvConflictError,
    BusClosedError (the bus closed, or JetStream did not answer in time)."""

    def __init__(
        self,
        bucket: str,
        kv: _NatsKeyValue,
        check_open: Callable[[], None],
        js: JetStreamContext,
    ) -> None:
        self.bucket = bucket
        self._kv = kv
        self._check_open = check_open  # raises BusClosedError once the bus is closed
        self._js = js

    async def get(self, key: str) -> KvEntry | None:
        """See ``bus.kv.KeyValue.get``."""
        self._check_open()
        try:
            entry = await self._kv.get(kv_key(key))
        except nats.js.errors.KeyNotFoundError:
            return None
        except nats.errors.Error as exc:
            raise self._failed(exc, key) from exc
        return KvEntry(key, entry.value or b"", entry.revision or 0)

    async def put(self, key: str, value: bytes) -> int:
        """See ``bus.kv.KeyValue.put``."""
        self._check_open()
        try:
            return await self._kv.put(kv_key(key), value)
        except nats.errors.Error as exc:
            raise self._failed(exc, key) from exc

    async def create(self, key: str, value: bytes) -> int:
        """See ``bus.kv.KeyValue.create``."""
        self._check_open()
        try:
            return await self._kv.create(kv_key(key), value)
        except nats.errors.Error as exc:
            raise self._failed(exc, key) from exc

    async def update(self, key: str, value: bytes, *, revision: int) -> int:
        """See ``bus.kv.KeyValue.update``."""
        self._check_open()
        try:
            return await self._kv.update(kv_key(key), value, last=revision)
        except nats.errors.Error as exc:
            raise self._failed(exc, key) from exc

    async def delete(self, key: str, *, revision: int | None = None) -> None:
        """See ``bus.kv.KeyValue.delete``."""
        self._check_open()
        if revision is not None and revision <= 0:
            raise KvConflictError(f"{self.bucket}/{key} is not at revision {revision}")
        try:
            await self._kv.delete(kv_key(key), last=revision)
        except nats.errors.Error as exc:
            raise self._failed(exc, key) from exc

    async def keys(self) -> list[str]:
        """See ``bus.kv.KeyValue.keys``.

        Read from the bucket stream's subjects (one request), each then read by name, not
        with nats-py's ``keys()``: its watcher may end the listing before the last keys
        under concurrent writes (nats.py #842, #995), and a host's heartbeat key left out
        of a listing would have its units taken from it while it lives."""
        self._check_open()
        prefix = f"$KV.{self.bucket}."
        try:
            info = await self._js.stream_info(f"KV_{self.bucket}", subjects_filter=f"{prefix}>")
            listed = [subject[len(prefix) :] for subject in info.state.subjects or {}]
            entries = await asyncio.gather(*(self._present(key) for key in listed))
        except nats.errors.Error as exc:
            raise self._failed(exc, "*") from exc
        return [kv_unkey(key) for key, present in zip(listed, entries, strict=True) if present]

    async def _present(self, raw_key: str) -> bool:
        """Whether the escaped ``raw_key``'s last entry is a value (not a delete or purge
        marker, and not expired)."""
        try:
            await self._kv.get(raw_key)
        except nats.js.errors.KeyNotFoundError:  # KeyDeletedError included
            return False
        return True

    @contextlib.asynccontextmanager
    async def watch(self) -> AsyncIterator[AsyncIterator[KvEntry]]:
        """See ``bus.kv.KeyValue.watch``. Raises BusClosedError."""
        self._check_open()
        try:
            watcher = await self._kv.watch(">")
        except nats.errors.Error as exc:
            raise self._failed(exc, ">") from exc

        async def iterate() -> AsyncIterator[KvEntry]:
            async for entry in watcher:
                if entry is None:  # nats-py's "initial values done" marker
                    continue
                key = kv_unkey(entry.key)
                if entry.operation in (_KV_DEL, _KV_PURGE):
                    yield KvEntry(key, b"", entry.revision or 0, deleted=True)
                else:
                    yield KvEntry(key, entry.value or b"", entry.revision or 0)

        try:
            yield iterate()
        finally:
            with contextlib.suppress(nats.errors.Error):
                await watcher.stop()  # type: ignore[no-untyped-call]

    def _failed(self, exc: nats.errors.Error, key: str) -> Exception:
        if isinstance(exc, nats.js.errors.KeyWrongLastSequenceError) or (
            isinstance(exc, nats.js.errors.APIError) and exc.err_code in _WRONG_LAST_SEQUENCE
        ):
            return KvConflictError(f"{self.bucket}/{key}: {exc.description}")
        if isinstance(exc, nats.js.errors.InvalidKeyError):
            return ValueError(f"invalid key-value key {key!r}")
        return BusClosedError(f"JetStream key-value {self.bucket}/{key}: {exc!r}")
