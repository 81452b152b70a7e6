"""StoreActor: owns the request log in the SQLite database (aiosqlite, WAL).

It reads ``Observation``s (``llmgw.obs.*``, one row per attempt) and ``RequestCompleted``
(``llmgw.request.*.done``, one row per client request) from its own subscriptions, straight
into a bounded buffer, and a background flusher commits the buffer in batches: every
``log.batch_rows`` rows or ``log.flush_ms`` after the first uncommitted row.

Guarantees (the README's "request log" section):

- The hot path never waits for the log: publishing never blocks, and when ``log.queue_rows``
  rows are already waiting (buffered or being written) a new row is dropped and counted,
  as are rows the bus itself dropped for a slow consumer and rows of a failed write.
- A crash (kill -9) loses the rows not yet committed: at most ``log.queue_rows``, plus any
  the bus had delivered to the store but it had not read yet (normally none: it reads them
  as they arrive). Under a load the disk keeps up with, that is the rows of the last
  ``log.flush_ms`` (about one batch). Committed rows survive (WAL, synchronous=NORMAL).
- A clean stop loses nothing: the flusher finishes its batch, the rows the bus already
  delivered are taken, and the rest is committed before the database closes.

Admin area ``log``: ``stats``, ``query`` (args of :class:`LogQuery`), ``flush``, ``prune``,
``aggregate`` (requests, errors and TTFT per minute, from memory: ``actors.state.log_aggregates``);
area ``spend``: ``report`` (args of :class:`actors.stores.spend_report.SpendQuery`).
Subscriptions use the queue group ``store``, so a replacement store started before the old
one stops (a config reload) shares the rows instead of writing them twice.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from actors.admin import AdminArea
from actors.base import Actor, ActorContext
from actors.state.log_aggregates import SEED_ROWS, SEED_SQL, WINDOW_MINUTES, LogAggregates
from actors.stores.db import open_db
from actors.stores.request_log import (
    INSERT,
    PRUNE,
    REQUEST_LOG,
    TABLE_INFO,
    LogQuery,
    Row,
    as_dicts,
    attempt_row,
    missing_columns,
    request_row,
)
from actors.stores.spend_report import (
    BACKFILL,
    HOUR_S,
    PRUNE_HOURLY,
    SPEND_HOURLY,
    UPSERT,
    SpendQuery,
    hourly_upserts,
)
from bus import BusClosedError
from schemas import AdminCommand, InvalidRequestError, Observation, RequestCompleted, subjects

if TYPE_CHECKING:
    from collections.abc import Callable

    import aiosqlite

    from bus import Envelope, Subscription
    from schemas import Message
    from schemas.config import LogConfig

logger = logging.getLogger(__name__)

_QUEUE = "store"
_PRUNE_INTERVAL_S = 3600.0
_SUBSCRIBE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class _Prune:
    """Local timer message: delete rows past the retention period."""


class StoreActor(Actor):
    """Owns the request log table. ``run`` raises BusClosedError if its subscriptions end
    while it serves; a failed write is logged and its rows counted as dropped."""

    def __init__(
        self, db_path: str, settings: LogConfig, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.name = "store"
        self._path = db_path
        self._settings = settings
        self._clock = clock
        self.admin = AdminArea(
            "log",
            {
                "stats": self._stats,
                "query": self._query,
                "flush": self._flush_cmd,
                "prune": self._prune_cmd,
                "aggregate": self._aggregate,
            },
            read_only=("stats", "query", "flush", "aggregate"),
        )
        self.spend = AdminArea("spend", {"report": self._spend_report}, read_only=("report",))
        self.serves = (self.admin.serve, self.spend.serve)

    async def on_start(self, ctx: ActorContext) -> None:
        """Open the database, subscribe, start the flusher and the retention timer."""
        self.ctx = ctx
        self._db: aiosqlite.Connection = await open_db(self._path, [REQUEST_LOG])
        await self._upgrade()
        self._pending: list[Row] = []
        self._writing = 0
        self._written = 0
        self._dropped_full = 0
        self._dropped_failed = 0
        self._subs: list[Subscription] = []
        self._aggregates = LogAggregates()
        await self._seed_aggregates()
        self._lock = anyio.Lock()
        self._rows_ready = anyio.Event()
        self._batch_full = anyio.Event()
        with anyio.fail_after(_SUBSCRIBE_TIMEOUT_S):
            for pattern in (subjects.OBSERVATION_ANY, subjects.REQUEST_DONE_ANY):
                ready = anyio.Event()
                ctx.start_soon(functools.partial(self._ingest, pattern, ready))
                await ready.wait()
        ctx.start_soon(self._flusher)
        await self._prune()
        ctx.call_later(_PRUNE_INTERVAL_S, _Prune())

    async def _upgrade(self) -> None:
        """Bring a file from before the cost columns and the spend aggregates up to date."""
        async with self._db.execute(TABLE_INFO) as cur:
            present = {str(r[0]) for r in await cur.fetchall()}
        for stmt in missing_columns(present):
            await self._db.execute(stmt)
        async with self._db.execute(
            "SELECT name FROM sqlite_master WHERE name = 'spend_hourly'"
        ) as cur:
            had_aggregates = await cur.fetchone() is not None
        for stmt in SPEND_HOURLY.statements:
            await self._db.execute(stmt)
        if not had_aggregates:
            await self._db.execute(BACKFILL)
        await self._db.commit()

    async def handle(self, env: Envelope) -> None:
        """Admin commands of areas ``log`` and ``spend``."""
        if self.admin.owns(env):
            await self.admin.answer(self.ctx, env)
        elif self.spend.owns(env):
            await self.spend.answer(self.ctx, env)

    async def handle_local(self, msg: object) -> None:
        """The retention timer."""
        if isinstance(msg, _Prune):
            await self._prune()
            self.ctx.call_later(_PRUNE_INTERVAL_S, _Prune())

    async def on_stop(self) -> None:
        """Commit what is left and close the database."""
        try:
            await self._flush()
        finally:
            await self._db.close()

    # -- ingest and flush -------------------------------------------------------------

    async def _ingest(self, pattern: str, ready: anyio.Event) -> None:
        async with self.ctx.bus.subscribe(pattern, queue=_QUEUE) as sub:
            self._subs.append(sub)
            ready.set()
            try:
                async for env in sub:
                    self._accept(env.message)
            finally:
                # Stopping: take what the bus already delivered (no waiting), so a clean
                # stop loses nothing that reached this process.
                with anyio.CancelScope(shield=True):
                    while getattr(sub, "pending", 0):
                        self._accept((await anext(aiter(sub))).message)
        raise BusClosedError(f"store: subscription to {pattern} ended")

    def _accept(self, msg: Message) -> None:
        if isinstance(msg, Observation):
            row = attempt_row(msg)
        elif isinstance(msg, RequestCompleted):
            row = request_row(msg)
        else:
            return
        if len(self._pending) + self._writing >= self._settings.queue_rows:
            self._dropped_full += 1
            if self._dropped_full & (self._dropped_full - 1) == 0:  # 1, 2, 4, ...
                logger.warning(
                    "request log queue full (%d rows): %d rows dropped so far",
                    self._settings.queue_rows,
                    self._dropped_full,
                )
            return
        self._pending.append(row)
        self._aggregates.add(row)
        if len(self._pending) == 1:
            self._rows_ready.set()
        if len(self._pending) >= self._settings.batch_rows:
            self._batch_full.set()

    async def _flusher(self) -> None:
        # Each wait makes its own event after checking, with no await in between, and only
        # this task replaces them: ``_accept`` sets whichever event is current, and a flush
        # by a query or an admin command cannot leave this task waiting on a stale one.
        flush_s = self._settings.flush_ms / 1000
        while True:
            if not self._pending:
                self._rows_ready = anyio.Event()
                await self._rows_ready.wait()
            if len(self._pending) < self._settings.batch_rows:
                self._batch_full = anyio.Event()
                with anyio.move_on_after(flush_s):
                    await self._batch_full.wait()
            await self._flush()

    async def _flush(self) -> int:
        """Commit every buffered row; returns how many. Never raises sqlite3.Error."""
        async with self._lock:
            batch, self._pending = self._pending, []
            if not batch:
                return 0
            self._writing = len(batch)
            try:
                # Shielded: a stop while writing waits for the commit instead of losing it.
                with anyio.CancelScope(shield=True):
                    await self._db.executemany(INSERT, batch)
                    await self._db.executemany(UPSERT, hourly_upserts(batch))
                    await self._db.commit()
            except sqlite3.Error as exc:
                self._dropped_failed += len(batch)
                logger.error("request log: writing %d rows failed: %s", len(batch), exc)
                return 0
            finally:
                self._writing = 0
            self._written += len(batch)
            return len(batch)

    async def _prune(self) -> int:
        cutoff = self._clock() - self._settings.retention_days * 86_400
        async with self._lock:
            try:
                cur = await self._db.execute(PRUNE, (cutoff,))
                await self._db.execute(PRUNE_HOURLY, (int(cutoff // HOUR_S),))
                await self._db.commit()
            except sqlite3.Error as exc:
                logger.error("request log: pruning failed: %s", exc)
                return 0
        deleted = max(cur.rowcount, 0)
        if deleted:
            logger.info(
                "request log: pruned %d rows older than %g days",
                deleted,
                self._settings.retention_days,
            )
        return deleted

    # -- admin ------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters of the log: written, dropped (by cause), waiting."""
        by_bus = sum(int(getattr(s, "dropped", 0)) for s in self._subs)
        return {
            "written": self._written,
            "dropped": self._dropped_full + self._dropped_failed + by_bus,
            "dropped_queue_full": self._dropped_full,
            "dropped_write_failed": self._dropped_failed,
            "dropped_by_bus": by_bus,
            "pending": len(self._pending) + self._writing,
            "queue_rows": self._settings.queue_rows,
        }

    async def _stats(self, cmd: AdminCommand) -> dict[str, Any]:
        return self.stats()

    async def _flush_cmd(self, cmd: AdminCommand) -> dict[str, Any]:
        await self._flush()
        return self.stats()

    async def _query(self, cmd: AdminCommand) -> dict[str, Any]:
        try:
            query = LogQuery.from_args(cmd.args, self._clock())
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        await self._flush()
        sql, params = query.sql()
        async with self._db.execute(sql, params) as cur:
            rows = [tuple(r) for r in await cur.fetchall()]
        return {"rows": as_dicts(rows)}

    async def _aggregate(self, cmd: AdminCommand) -> dict[str, Any]:
        """Rates and TTFT percentiles from memory (``actors.state.log_aggregates``), no table
        scan."""
        return self._aggregates.view(self._clock())

    async def _seed_aggregates(self) -> None:
        """Fill the aggregates from the window's newest rows (at most SEED_ROWS: one bounded
        read at start, so a restart does not blank the dashboard's rates)."""
        since = self._clock() - WINDOW_MINUTES * 60
        try:
            async with self._db.execute(SEED_SQL, (since, SEED_ROWS)) as cur:
                rows = list(await cur.fetchall())
        except sqlite3.Error as exc:
            logger.error("request log: reading the last hour for the aggregates failed: %s", exc)
            return
        for row in reversed(rows):
            self._aggregates.add(tuple(row))

    async def _spend_report(self, cmd: AdminCommand) -> dict[str, Any]:
        try:
            query = SpendQuery.from_args(cmd.args, self._clock())
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        await self._flush()
        rows: list[tuple[Any, ...]] = []
        for sql, params in query.queries():
            async with self._db.execute(sql, params) as cur:
                rows += [tuple(r) for r in await cur.fetchall()]
        return query.result(rows)

    async def _prune_cmd(self, cmd: AdminCommand) -> dict[str, Any]:
        return {"deleted": await self._prune()}
