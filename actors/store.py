"""StoreActor: owns the request log and the spend aggregates, in the SQLite database
(aiosqlite, WAL) or, with ``database.url``, in PostgreSQL (``actors.stores.log_storage``).

Each ingress sends it the rows of the requests it served as ``LogAppend`` batches on
``llmgw.log.append`` (its own subscription, queue group ``store``; see
``gateway.ingress.accounting``): one row per client request (``RequestCompleted``) and one per
upstream attempt (``Observation``). A background flusher commits what arrived within a
short window (group commit: the lesser of ``log.flush_ms`` and 50 ms; what arrives during a
write goes in the next), so within ``log.flush_ms``; each ingress sends at most
``log.batch_rows`` rows a batch. Each batch is answered (``LogAppended``) only once it is
committed, with its sender's ``seq`` in the
``log_senders`` table in the same transaction, so a batch sent again is committed once.

Guarantees (the README's "request log" section):

- The hot path never waits for the log: the ingress keeps the rows and sends them in the
  background. When ``log.queue_rows`` rows already wait here (buffered or being written) a
  batch is refused (retryable): its ingress keeps it and sends it again.
- A crash (kill -9) of this process loses nothing acknowledged (committed: WAL,
  synchronous=NORMAL; or PostgreSQL's commit) and nothing unacknowledged either: each
  ingress keeps those rows and sends them again until a store commits them. A failed
  write is logged and its batches refused, so they come back too.
- A row no database can hold (a count past 64 bits, a NaN) is left out of its batch once a
  write fails, counted (``refused_unwritable_rows``) and logged; the rest is written again at
  once and answered, so the row is not sent again forever and never stops the rows after it.
- A clean stop commits what it took before the database closes.

Admin area ``log``: ``stats``, ``query`` (args of :class:`LogQuery`), ``flush``, ``prune``,
``aggregate`` (requests, errors and TTFT per minute, from memory: ``actors.state.log_aggregates``);
area ``spend``: ``report`` (args of :class:`actors.stores.spend_report.SpendQuery`).
A replacement store started before the old one stops (a config reload) shares the batches
(queue group) and the ``log_senders`` table, so neither commits a batch the other did.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from actors.admin import AdminArea
from actors.base import Actor, ActorContext
from actors.state.log_aggregates import SEED_ROWS, SEED_SECONDS, SEED_SQL, LogAggregates
from actors.stores.log_storage import LogStorageError, log_storage
from actors.stores.request_log import (
    COLUMNS,
    LogQuery,
    Row,
    as_dicts,
    attempt_row,
    request_row,
    unwritable,
)
from actors.stores.spend_report import SPEND_ARGS, SpendQuery
from bus import BusClosedError
from schemas import (
    AdminCommand,
    BusTimeoutError,
    GatewayError,
    InvalidRequestError,
    LogAppend,
    LogAppended,
    subjects,
)
from schemas.config import DatabaseConfig

if TYPE_CHECKING:
    from collections.abc import Callable

    from actors.stores.log_storage import LogStorage
    from bus import Envelope
    from schemas import Message
    from schemas.config import LogConfig

logger = logging.getLogger(__name__)

_QUEUE = "store"
_COMMIT_WINDOW_MS = 50
_PRUNE_INTERVAL_S = 3600.0
_SUBSCRIBE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class _Prune:
    """Local timer message: delete rows past the retention period."""


@dataclass(slots=True)
class _Batch:
    """One ``LogAppend`` taken, not yet committed, and who waits for its answer."""

    sender: str
    seq: int
    rows: list[Row]
    waiters: list[Envelope]


_LOG_ARGS = {
    "query": frozenset(
        {"since", "until", "model", "kind", "request_id", "status", "outcome", "caller_id", "limit"}
    ),
    "aggregate": frozenset({"range", "by"}),
    "stats": frozenset(),
    "flush": frozenset(),
    "prune": frozenset(),
}
"""The arguments each ``log`` verb takes: a misspelt filter (``modle``) is refused, not
dropped into a query that answers every row."""


class StoreActor(Actor):
    """Owns the request log's tables. ``run`` raises BusClosedError if its subscriptions end
    while it serves, LogStorageError if the database cannot be opened; a failed write is
    logged and its batches refused (sent again)."""

    def __init__(
        self,
        database: DatabaseConfig | str,
        settings: LogConfig,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = "store"
        # A bare string: the SQLite file's path (tests, tools).
        self._database = DatabaseConfig(path=database) if isinstance(database, str) else database
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
            args=_LOG_ARGS,
        )
        self.spend = AdminArea("spend", {"report": self._spend_report}, args={"report": SPEND_ARGS})
        self.serves = (self.admin.serve, self.spend.serve)

    async def on_start(self, ctx: ActorContext) -> None:
        """Open the database, subscribe, start the flusher and the retention timer."""
        self.ctx = ctx
        self._db: LogStorage = log_storage(self._database)
        await self._db.open()
        logger.info("request log in %s", self._db.describe())
        self._pending: list[_Batch] = []
        self._pending_rows = 0
        self._writing = 0
        self._written = 0
        self._duplicates = 0
        self._refused_full = 0
        self._refused_failed = 0
        self._unwritable = 0
        self._aggregates = LogAggregates()
        await self._seed_aggregates()
        self._lock = anyio.Lock()
        self._rows_ready = anyio.Event()
        ready = anyio.Event()
        ctx.start_soon(functools.partial(self._ingest, subjects.LOG_APPEND, ready))
        with anyio.fail_after(_SUBSCRIBE_TIMEOUT_S):
            await ready.wait()
        ctx.start_soon(self._flusher)
        await self._prune()
        ctx.call_later(_PRUNE_INTERVAL_S, _Prune())

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
            ready.set()
            try:
                async for env in sub:
                    await self._take(env)
            finally:
                # Stopping: take what the bus already delivered (no waiting), so a clean
                # stop commits it rather than leave it to be sent again.
                with anyio.CancelScope(shield=True):
                    while getattr(sub, "pending", 0):
                        await self._take(await anext(aiter(sub)))
        raise BusClosedError(f"store: subscription to {pattern} ended")

    async def _take(self, env: Envelope) -> None:
        """Buffer ``env``'s batch for the flusher (answered once committed), or refuse it now
        when the buffer is full (its sender keeps it and sends it again)."""
        batch = env.message
        if not isinstance(batch, LogAppend):
            return
        rows = [request_row(d) for d in batch.requests] + [attempt_row(o) for o in batch.attempts]
        waiting = self._pending_rows + self._writing
        if waiting and waiting + len(rows) > self._settings.queue_rows:
            self._refused_full += 1
            if self._refused_full & (self._refused_full - 1) == 0:  # 1, 2, 4, ...
                logger.warning(
                    "request log queue full (%d rows): %d batches refused so far "
                    "(their ingresses keep them and send them again)",
                    self._settings.queue_rows,
                    self._refused_full,
                )
            await self._answer(
                [env], BusTimeoutError("the request log is busy; send the batch again")
            )
            return
        self._pending.append(_Batch(batch.sender, batch.seq, rows, [env]))
        self._pending_rows += len(rows)
        self._rows_ready.set()

    @staticmethod
    def _without_unwritable(batches: list[_Batch]) -> list[tuple[Row, str]]:
        """Take the rows a database may refuse out of ``batches``; each with its column.
        Looked for only once a write failed: a check of every row cost about 3 µs a row, and
        the adapters already keep the upstream's numbers sane."""
        left_out: list[tuple[Row, str]] = []
        for b in batches:
            kept = []
            for row in b.rows:
                column = unwritable(row)
                if column is None:
                    kept.append(row)
                else:
                    left_out.append((row, column))
            b.rows = kept
        return left_out

    def _count_left_out(self, left_out: list[tuple[Row, str]]) -> None:
        """Count and log rows left out of a write that then committed."""
        for row, column in left_out:
            self._unwritable += 1
            if self._unwritable & (self._unwritable - 1) == 0:  # 1, 2, 4, ...
                logger.error(
                    "request log: a %s row of request %s left out: its %s (%.40r) cannot be "
                    "stored (%d rows so far)",
                    row[1],
                    row[2],
                    column,
                    row[COLUMNS.index(column)],
                    self._unwritable,
                )

    async def _flusher(self) -> None:
        # Group commit: each write takes every batch that arrived, and what arrives during
        # it goes in the next one, so a batch waits for at most one write before its commit
        # (well under flush_ms) and busy ingresses get large writes. The batching itself is
        # done by each ingress (one batch in flight; see gateway.ingress.accounting). The
        # event is replaced only here, after checking, with no await in between, so a flush
        # by a query or an admin command cannot leave this task waiting on a stale one.
        #
        # A write is also held for a short window once rows arrive (at most ``flush_ms``,
        # and 50 ms): at low concurrency every request would otherwise cost its own commit
        # and answer (measured: about a quarter of a millisecond of CPU per request), while
        # the rows wait at their ingress, which keeps them until this answer anyway.
        window = min(self._settings.flush_ms, _COMMIT_WINDOW_MS) / 1000
        while True:
            if not self._pending:
                self._rows_ready = anyio.Event()
                await self._rows_ready.wait()
            await anyio.sleep(window)
            await self._flush()

    async def _append(self, batches: list[_Batch]) -> list[_Batch]:
        # Shielded: a stop while writing waits for the commit instead of losing it.
        with anyio.CancelScope(shield=True):
            fresh = await self._db.append(batches, self._clock())
        return fresh

    async def _flush(self) -> int:
        """Commit every buffered batch, then answer their senders; returns how many rows were
        written. Never raises LogStorageError: a failed write refuses its batches (resent)."""
        async with self._lock:
            batches, self._pending = self._pending, []
            if not batches:
                return 0
            self._writing, self._pending_rows = self._pending_rows, 0
            try:
                try:
                    fresh = await self._append(batches)
                except LogStorageError:
                    left_out = self._without_unwritable(batches)
                    if not left_out:
                        raise
                    fresh = await self._append(batches)  # the rest, once
                    self._count_left_out(left_out)  # (if that failed too, all come again)
            except LogStorageError as exc:
                self._refused_failed += len(batches)
                logger.error(
                    "request log: writing %d rows failed (their ingresses send them again): %s",
                    self._writing,
                    exc,
                )
                failed: GatewayError | None = BusTimeoutError("the request log could not write")
                fresh = []
            else:
                failed = None
            finally:
                self._writing = 0
        if failed is not None:
            for b in batches:
                await self._answer(b.waiters, failed)
            return 0
        written = sum(len(b.rows) for b in fresh)
        self._written += written
        self._duplicates += len(batches) - len(fresh)
        for b in fresh:
            for row in b.rows:
                self._aggregates.add(row)
        new = {id(b) for b in fresh}
        for b in batches:
            await self._answer(b.waiters, LogAppended(seq=b.seq, duplicate=id(b) not in new))
        return written

    @staticmethod
    async def _answer(waiters: list[Envelope], reply: LogAppended | GatewayError) -> None:
        msg: Message = reply.to_reply() if isinstance(reply, GatewayError) else reply
        for env in waiters:
            try:
                await env.respond(msg)
            except BusClosedError:  # the sender sends it again to the next store
                return

    async def _prune(self) -> int:
        cutoff = self._clock() - self._settings.retention_days * 86_400
        async with self._lock:
            try:
                deleted = await self._db.prune(cutoff)
            except LogStorageError as exc:
                logger.error("request log: pruning failed: %s", exc)
                return 0
        if deleted:
            logger.info(
                "request log: pruned %d rows older than %g days",
                deleted,
                self._settings.retention_days,
            )
        return deleted

    # -- admin ------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters of the log: rows written and waiting; batches refused (by cause; their
        ingresses send them again) and taken twice; rows left out as no database can hold
        them (``refused_unwritable_rows``: answered, never sent again). Otherwise rows are
        dropped only by an ingress whose own buffer is full (its log says so): the
        ``dropped`` keys stay 0."""
        return {
            "written": self._written,
            "dropped": 0,
            "dropped_queue_full": 0,
            "dropped_write_failed": 0,
            "dropped_by_bus": 0,
            "refused_queue_full": self._refused_full,
            "refused_write_failed": self._refused_failed,
            "refused_unwritable_rows": self._unwritable,
            "duplicate_batches": self._duplicates,
            "pending": self._pending_rows + self._writing,
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
        return {"rows": as_dicts(await self._read(sql, params))}

    async def _aggregate(self, cmd: AdminCommand) -> dict[str, Any]:
        """Rates and TTFT percentiles from memory (``actors.state.log_aggregates``), no table
        scan; with ``range`` (hour, day) and ``by`` (model, endpoint), their time series."""
        over, by = cmd.args.get("range"), cmd.args.get("by", "model")
        try:
            return self._aggregates.view(
                self._clock(), None if over is None else str(over), str(by)
            )
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None

    async def _seed_aggregates(self) -> None:
        """Fill the aggregates from the last day's newest rows (at most SEED_ROWS: one bounded
        read at start, so a restart does not blank the dashboard's rates)."""
        since = self._clock() - SEED_SECONDS
        try:
            rows = await self._db.fetch(SEED_SQL, (since, SEED_ROWS))
        except LogStorageError as exc:
            logger.error("request log: reading the last hour for the aggregates failed: %s", exc)
            return
        for row in reversed(rows):
            self._aggregates.add(row)

    async def _spend_report(self, cmd: AdminCommand) -> dict[str, Any]:
        try:
            query = SpendQuery.from_args(cmd.args, self._clock())
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        await self._flush()
        rows: list[Row] = []
        for sql, params in query.queries():
            rows += await self._read(sql, params)
        return query.result(rows)

    async def _read(self, sql: str, params: list[Any]) -> list[Row]:
        """One SELECT's rows. Raises BusTimeoutError (retryable) when the database fails."""
        try:
            return await self._db.fetch(sql, params)
        except LogStorageError as exc:
            logger.error("request log: reading failed: %s", exc)
            raise BusTimeoutError("the request log could not be read; try again") from None

    async def _prune_cmd(self, cmd: AdminCommand) -> dict[str, Any]:
        return {"deleted": await self._prune()}
