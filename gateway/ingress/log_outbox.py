"""The ingress's request-log outbox: rows kept until their owner says they are committed.

Each client request that ends leaves one ``RequestCompleted`` and its attempts'
``Observation``s here (:meth:`LogOutbox.add`: no await, nothing on the request's path). One
task sends them to the StoreActor as ``LogAppend`` batches on ``llmgw.log.append``, one batch
in flight at a time: what ends while a batch waits for its answer forms the next one, so the
batches grow with the load (at most ``log.batch_rows`` rows, and :data:`BATCH_ROWS_MAX`). The
store answers only once the batch is committed; until then the batch stays here and is sent
again (same ``sender`` and ``seq``, so the store commits it once) every :data:`RETRY_S` while
no owner answers, or after ``flush_ms`` + :data:`ACK_GRACE_S` without an answer: a store that
crashed or is restarting (a kill -9 of the actors process) loses none of it.

Bounded: at most ``log.queue_rows`` rows wait here; past that a new request's rows are
dropped, counted (:attr:`LogOutbox.dropped`) and logged. A clean stop sends what is left
before the bus closes (for at most :data:`CLOSE_WAIT_S`); an ingress killed with rows still
unacknowledged loses those (at most its last ``flush_ms`` or so of traffic).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections import deque
from typing import TYPE_CHECKING

from schemas import GatewayError, LogAppend, LogAppended, raise_for_reply, subjects

if TYPE_CHECKING:
    from collections.abc import Sequence

    from bus import Bus
    from schemas import Observation, RequestCompleted
    from schemas.config import LogConfig

logger = logging.getLogger(__name__)

BATCH_ROWS_MAX = 512
"""The most rows one ``LogAppend`` carries (well under NATS's 1 MB message limit)."""
RETRY_S = 0.5
"""How long a batch no owner answered waits before it is sent again."""
ACK_GRACE_S = 5.0
"""How long past ``flush_ms`` the store may take to answer a batch before it is sent again."""
CLOSE_WAIT_S = 5.0
"""How long a clean stop waits for the rows still here to be acknowledged."""


class LogOutbox:
    """Owns this ingress's unacknowledged request-log rows and the task sending them."""

    def __init__(self, bus: Bus, settings: LogConfig) -> None:
        self._bus = bus
        self._settings = settings
        # Unique per process lifetime: a restarted ingress (pid 1 in a container again)
        # must never look like the old one, whose seqs the store already committed.
        self.sender = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        self._queue: deque[tuple[RequestCompleted, Sequence[Observation]]] = deque()
        self._queued_rows = 0
        self._batch: LogAppend | None = None  # sent, not yet acknowledged
        self._seq = 0
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.dropped = 0
        self._drops = 0
        self.failures = 0  # sends not acknowledged since the last acknowledged one

    def reconfigure(self, settings: LogConfig) -> None:
        """Use ``settings`` (a reloaded ``log:`` section) from the next batch on."""
        self._settings = settings

    @property
    def waiting(self) -> int:
        """Rows here not yet acknowledged as committed (queued and in flight)."""
        batch = self._batch
        in_flight = len(batch.requests) + len(batch.attempts) if batch is not None else 0
        return self._queued_rows + in_flight

    def add(self, done: RequestCompleted, attempts: Sequence[Observation]) -> None:
        """Keep one request's rows for the store; never blocks, never raises."""
        rows = 1 + len(attempts)
        if self.waiting + rows > self._settings.queue_rows:
            self.dropped += rows
            self._drops += 1
            if self._drops & (self._drops - 1) == 0:  # 1, 2, 4, ...: not once per request
                logger.error(
                    "request log: %d rows wait for the store (log.queue_rows); "
                    "%d rows dropped so far",
                    self.waiting,
                    self.dropped,
                )
            return
        self._queue.append((done, attempts))
        self._queued_rows += rows
        self._drained.clear()
        self._wake.set()

    async def drained(self) -> None:
        """Return once no row is kept here (every one acknowledged, or none added)."""
        await self._drained.wait()

    def start(self) -> None:
        """Start the sending task."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="log-outbox")

    async def aclose(self, wait: float = CLOSE_WAIT_S) -> None:
        """Send what is left (for at most ``wait`` seconds, and not past the first send the
        store does not acknowledge), then stop; rows still here are logged as lost."""
        task, self._task = self._task, None
        if task is None:
            return
        self._closing = True
        self._wake.set()
        await asyncio.wait({task}, timeout=wait)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if self.waiting:
            logger.error("request log: %d rows not acknowledged by the store at stop", self.waiting)

    async def _run(self) -> None:
        while True:
            if self._batch is None:
                if not self._queue:
                    self._drained.set()
                    if self._closing:
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                self._batch = self._next_batch()
            if await self._send(self._batch):
                self._batch = None
            elif self._closing:
                return  # stopping, and no store takes the rows now
            else:
                await asyncio.sleep(RETRY_S)

    def _next_batch(self) -> LogAppend:
        requests: list[RequestCompleted] = []
        attempts: list[Observation] = []
        rows = 0
        cap = min(self._settings.batch_rows, BATCH_ROWS_MAX)
        while self._queue:
            done, tried = self._queue[0]
            if requests and rows + 1 + len(tried) > cap:
                break
            self._queue.popleft()
            requests.append(done)
            attempts.extend(tried)
            rows += 1 + len(tried)
        self._queued_rows -= rows
        self._seq += 1
        return LogAppend(
            sender=self.sender, seq=self._seq, requests=tuple(requests), attempts=tuple(attempts)
        )

    async def _send(self, batch: LogAppend) -> bool:
        """True once the store acknowledged ``batch`` (committed now or before)."""
        timeout = self._settings.flush_ms / 1000 + ACK_GRACE_S
        try:
            raise_for_reply(
                await self._bus.request(
                    subjects.LOG_APPEND, batch, reply_type=LogAppended, timeout=timeout
                )
            )
        except Exception as exc:  # kept and sent again: the outbox must outlive any failure
            if not isinstance(exc, GatewayError):
                logger.exception("request log: sending a batch failed")
            self.failures += 1
            if self.failures & (self.failures - 1) == 0:  # 1, 2, 4, ...: not every retry
                logger.warning(
                    "request log: %d rows kept for the store until it answers (%s)",
                    self.waiting,
                    exc.message if isinstance(exc, GatewayError) else type(exc).__name__,
                )
            return False
        if self.failures:
            logger.info("request log: the store answers again; delivering the kept rows")
            self.failures = 0
        return True
