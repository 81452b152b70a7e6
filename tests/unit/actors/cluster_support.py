"""A bus whose key-value buckets can be cut off from JetStream, or left unanswered, for the
cluster tests: what a host sees when NATS is partitioned from it or elects a leader."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from bus import BusClosedError, InProcessBus

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager

    from bus import KeyValue, KvEntry


class CuttableKv:
    """A bucket that raises BusClosedError once ``cut`` (a host cut off from JetStream), and
    whose calls wait while its ``gate`` is closed (JetStream slow to answer)."""

    def __init__(self, inner: KeyValue, cut: list[bool], gate: asyncio.Event) -> None:
        self.bucket = inner.bucket
        self._inner = inner
        self._cut = cut
        self._gate = gate

    def _check(self) -> KeyValue:
        if self._cut[0]:
            raise BusClosedError("cut off")
        return self._inner

    async def _live(self) -> KeyValue:
        await self._gate.wait()
        return self._check()

    async def get(self, key: str) -> KvEntry | None:
        return await (await self._live()).get(key)

    async def put(self, key: str, value: bytes) -> int:
        return await (await self._live()).put(key, value)

    async def create(self, key: str, value: bytes) -> int:
        return await (await self._live()).create(key, value)

    async def update(self, key: str, value: bytes, *, revision: int) -> int:
        return await (await self._live()).update(key, value, revision=revision)

    async def delete(self, key: str, *, revision: int | None = None) -> None:
        await (await self._live()).delete(key, revision=revision)

    async def keys(self) -> list[str]:
        return await (await self._live()).keys()

    def watch(self) -> AbstractAsyncContextManager[AsyncIterator[KvEntry]]:
        return self._check().watch()


class CuttableBus(InProcessBus):
    def __init__(self, inner: InProcessBus) -> None:
        super().__init__()
        self.inner = inner
        self.cut = [False]
        self.gates: dict[str, asyncio.Event] = {}  # bucket -> open while set

    async def key_value(
        self, bucket: str, *, ttl: float | None = None, replicas: int = 1
    ) -> KeyValue:
        gate = self.gates.setdefault(bucket, asyncio.Event())
        gate.set()
        return CuttableKv(await self.inner.key_value(bucket, ttl=ttl), self.cut, gate)
