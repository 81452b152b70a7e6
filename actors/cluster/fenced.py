"""Actor snapshots in a key-value bucket, written only under a held lease, off the actors'
message loops.

The guarantee: once another host's compare-and-set took a unit's owner entry, every later
snapshot write of the previous owner is refused, and none of its earlier writes can
overwrite what the new owner wrote. Two fences give it: before each write the owner entry's
revision must still be the lease's, and each snapshot key is itself written by
compare-and-set on the revision this owner last saw, a revision the new owner moves on
loading (it rewrites the key as it reads it). A refused write is logged and reported to
``on_lost``, which stops the unit; it is not raised into the actor.

Writes are behind: ``save`` hands the snapshot to this store's one writer task and returns,
so an actor keeps serving while JetStream elects a new leader for the bucket (seconds after
a NATS server died, when every write waits out its timeout). The writer keeps only the
latest snapshot of each name (a newer one replaces one not yet written, so an older one can
never land after it) and retries a failed write until it lands or is refused. A ``durable``
save (operator commands) waits for its write. The host drains the writer (``drain``) before
it releases the unit's lease, so a handed-back unit's last state is in the bucket when the
next owner loads it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from actors.stores.snapshots import SnapshotStore
from bus import BusClosedError, KvConflictError
from schemas import BusTimeoutError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from actors.cluster.placement import Lease, Owners
    from bus import KeyValue

logger = logging.getLogger(__name__)

SNAPSHOTS_BUCKET = "llmgw_snapshots"
RETRY_SECONDS = 0.5  # between attempts of a write JetStream did not take
# An operator command's save waits this long for its write: past a leader election, and
# short of the admin API's own timeout, so the operator reads why.
DURABLE_WAIT_SECONDS = 15.0


class FencedSnapshots(SnapshotStore):
    """The SnapshotStore of one placed unit: snapshots in ``kv`` fenced by ``lease``, written
    by a writer task of its own.

    ``load`` raises BusClosedError when JetStream cannot be reached; ``save`` raises nothing
    for a routine snapshot and BusTimeoutError for a durable one not written in
    ``durable_wait`` seconds or refused (the lease is lost).
    """

    def __init__(
        self,
        kv: KeyValue,
        owners: Owners,
        lease: Lease,
        on_lost: Callable[[], None],
        *,
        retry_seconds: float = RETRY_SECONDS,
        durable_wait: float = DURABLE_WAIT_SECONDS,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        # Not SnapshotStore.__init__: no SQLite connection; only load and save are used.
        self._kv = kv
        self._owners = owners
        self._lease = lease
        self._on_lost = on_lost
        self._retry_seconds = retry_seconds
        self._durable_wait = durable_wait
        self._sleep = sleep
        self._seen: dict[str, int] = {}  # snapshot name -> its revision this owner wrote
        self._pending: dict[str, tuple[int, bytes]] = {}  # name -> (generation, latest data)
        self._generation = 0
        self._settled: dict[str, tuple[int, bool]] = {}  # name -> (generation, written)
        self._changed = asyncio.Condition()
        self._writer: asyncio.Task[None] | None = None
        self.refused = 0

    async def load(self, name: str) -> bytes | None:
        """The snapshot ``name``, taken over for this lease (so an older owner's pending
        write can no longer land); a snapshot handed to the writer and not written yet is
        returned as it is."""
        pending = self._pending.get(name)
        if pending is not None:
            return pending[1]
        return await self._take_over(name)

    async def save(self, name: str, data: bytes, now: float, *, durable: bool = False) -> None:
        """Hand ``data`` to the writer as the snapshot ``name``; with ``durable``, return
        only once it (or a later one) is written. Raises BusTimeoutError (durable only)."""
        self._generation += 1
        generation = self._generation
        self._pending[name] = (generation, data)
        if self._writer is None or self._writer.done():
            writing = self._writing()
            self._writer = asyncio.create_task(writing, name=f"snapshots:{self._lease.unit}")
        if durable:
            await self._written(name, generation)

    async def drain(self, timeout: float) -> bool:
        """Wait until every snapshot handed over is written or refused; False when some were
        still pending after ``timeout`` seconds (JetStream unreachable)."""
        if not self._pending:
            return True
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                async with self._changed:
                    await self._changed.wait_for(lambda: not self._pending)
        except TimeoutError:
            return False
        return True

    async def aclose(self) -> None:
        """Stop the writer; snapshots not written by then are dropped (logged)."""
        writer, self._writer = self._writer, None
        if writer is not None and not writer.done():
            writer.cancel()
            await asyncio.wait([writer])
        if self._pending:
            logger.warning(
                "%s dropped unwritten snapshots of %s: %s",
                self._lease.node,
                self._lease.unit,
                ", ".join(sorted(self._pending)),
            )
            self._pending.clear()

    async def _written(self, name: str, generation: int) -> None:
        def settled() -> bool:
            return self._settled.get(name, (0, False))[0] >= generation

        try:
            async with asyncio.timeout(self._durable_wait):
                async with self._changed:
                    await self._changed.wait_for(settled)
        except TimeoutError:
            raise BusTimeoutError(
                f"the change is applied but not yet stored (JetStream did not take it in "
                f"{self._durable_wait:g} s); it is being retried"
            ) from None
        if not self._settled[name][1]:
            raise BusTimeoutError("the change was not stored: this host no longer owns it")

    async def _writing(self) -> None:
        failing = False
        while self._pending:
            name, (generation, data) = next(iter(self._pending.items()))
            try:
                written = await self._write(name, data)
            except BusClosedError as exc:
                if not failing:
                    logger.warning(
                        "snapshot of %s not written yet (retrying): %s", name, exc.message
                    )
                failing = True
                await self._sleep(self._retry_seconds)
                continue
            except Exception:
                # Not JetStream's absence (a bug, say): dropping this snapshot keeps the
                # writer alive for the others.
                logger.exception("snapshot of %s dropped", name)
                written = False
            if failing:
                logger.info("snapshots of %s are being written again", self._lease.unit)
                failing = False
            if self._pending.get(name, (0, b""))[0] == generation:
                del self._pending[name]  # else a newer one came meanwhile: write that next
            async with self._changed:
                self._settled[name] = (generation, written)
                self._changed.notify_all()

    async def _write(self, name: str, data: bytes) -> bool:
        """Replace the snapshot ``name`` if this lease still holds; else refuse (logged).
        True when written. Raises BusClosedError."""
        if name not in self._seen:
            await self._take_over(name)
        if not await self._owners.holds(self._lease):
            self._refuse(name, "the lease is lost")
            return False
        seen = self._seen[name]
        try:
            if seen == 0:
                self._seen[name] = await self._kv.create(name, data)
            else:
                self._seen[name] = await self._kv.update(name, data, revision=seen)
        except KvConflictError:
            self._refuse(name, "another owner wrote it")
            return False
        return True

    async def _take_over(self, name: str) -> bytes | None:
        """Read ``name`` and rewrite it at once, moving its revision past any write of an
        older owner still on its way."""
        while True:
            entry = await self._kv.get(name)
            try:
                if entry is None:
                    self._seen[name] = 0
                    return None
                self._seen[name] = await self._kv.update(name, entry.value, revision=entry.revision)
            except KvConflictError:
                continue  # written between our read and our take-over: read it again
            return entry.value

    def _refuse(self, name: str, why: str) -> None:
        self.refused += 1
        logger.warning(
            "refused a snapshot of %s from %s for %s: %s",
            name,
            self._lease.node,
            self._lease.unit,
            why,
        )
        self._on_lost()
