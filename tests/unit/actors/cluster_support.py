"""A bus whose key-value buckets can be cut off from JetStream, or left unanswered, for the
cluster tests: what a host sees when NATS is partitioned from it or elects a leader; and a
link to a shared bus that can be cut and restored (a process dead, or reconnecting)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import TYPE_CHECKING, Any, TypeVar

from actors import ChildSpec, Supervisor
from bus import BusClosedError, InProcessBus, RequestTimeoutError
from tests.unit.actors import EchoActor

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager

    from actors import SnapshotStore
    from bus import KeyValue, KvEntry
    from bus.inprocess import BufferedSubscription
    from schemas import ErrorReply, Message
    from tests.unit.actors import Journal

T = TypeVar("T")

# The tree's top-level children as the cluster places them (a unit each).
UNITS = ("store", "endpoints", "keys", "models", "limits", "rules", "steering")


def echo_tree(journal: Journal, snapshots: SnapshotStore | None) -> Supervisor:
    """A tree of one EchoActor per unit, each writing what it handles to ``journal``."""
    return Supervisor(
        "root",
        children=[ChildSpec(u, functools.partial(EchoActor, u, journal)) for u in UNITS],
    )


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
        self, bucket: str, *, ttl: float | None = None, replicas: int = 1, grow_only: bool = False
    ) -> KeyValue:
        gate = self.gates.setdefault(bucket, asyncio.Event())
        gate.set()
        return CuttableKv(await self.inner.key_value(bucket, ttl=ttl), self.cut, gate)


class Link:
    """One process's connection to a shared in-process bus, which ``cut`` takes from it (what
    the server does when the process dies or its connection drops) and ``restore`` gives back
    with every subscription (a reconnect): while cut, no request reaches its subscribers,
    its own requests fail and its buckets are cut off."""

    def __init__(self, inner: InProcessBus) -> None:
        self.inner = inner
        self.cut = [False]
        self._subs: list[BufferedSubscription] = []
        self._gate = asyncio.Event()
        self._gate.set()
        self._back = asyncio.Event()
        self._gone = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self.inner.closed

    @property
    def connected(self) -> bool:
        return not (self.cut[0] or self.inner.closed)

    @property
    def servers(self) -> int:
        return 1

    def drop(self) -> None:
        """Cut the connection: its subscriptions leave the bus's routes."""
        self.cut[0] = True
        gone, self._gone = self._gone, asyncio.Event()
        gone.set()
        for sub in self._subs:
            if sub in self.inner._subs:
                self.inner._subs.remove(sub)
        self.inner._routes.clear()

    def restore(self) -> None:
        """Reconnect: every subscription still open is routed to again."""
        self.cut[0] = False
        self.inner._subs.extend(s for s in self._subs if not s.closed)
        self.inner._routes.clear()
        back, self._back = self._back, asyncio.Event()
        back.set()

    async def reconnected(self) -> None:
        await self._back.wait()

    async def disconnected(self) -> None:
        if self.connected:
            await self._gone.wait()

    async def publish(self, subject: str, msg: Message) -> None:
        if not self.cut[0]:
            await self.inner.publish(subject, msg)

    async def request(
        self, subject: str, msg: Message, *, reply_type: type[T], timeout: float
    ) -> T | ErrorReply:
        if self.cut[0]:
            raise RequestTimeoutError(f"cut off: {subject}")
        return await self.inner.request(subject, msg, reply_type=reply_type, timeout=timeout)

    @contextlib.asynccontextmanager
    async def subscribe(
        self, subject: str, *, queue: str | None = None
    ) -> AsyncIterator[BufferedSubscription]:
        async with self.inner.subscribe(subject, queue=queue) as sub:
            self._subs.append(sub)
            if self.cut[0]:
                self.drop()
            try:
                yield sub
            finally:
                self._subs.remove(sub)

    def replay(
        self, subject: str, *, stream: str, since: float
    ) -> AbstractAsyncContextManager[BufferedSubscription]:
        return self.inner.replay(subject, stream=stream, since=since)

    async def ensure_stream(self, name: str, subjects: list[str], **kept: Any) -> None:
        await self.inner.ensure_stream(name, subjects, **kept)

    async def delete_stream(self, name: str) -> None:
        await self.inner.delete_stream(name)

    async def key_value(
        self, bucket: str, *, ttl: float | None = None, replicas: int = 1, grow_only: bool = False
    ) -> KeyValue:
        return CuttableKv(await self.inner.key_value(bucket, ttl=ttl), self.cut, self._gate)

    async def aclose(self) -> None:
        """Nothing: the shared bus outlives the link."""
