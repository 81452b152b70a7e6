"""The request log's table: one row per client request and one per upstream attempt.

Pure helpers shared by the StoreActor (writes, prunes) and ``llmgw logs`` (reads the file
directly, or asks the StoreActor over the bus): the migration, row conversion, and the one
query. Callers are stored as ``c-…`` hashes; credentials only ever as their ``k-…`` ids.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.stores.db import Migration
from schemas import InvalidRequestError, priced_tokens
from schemas.keys import fits_int64, parse_since

if TYPE_CHECKING:
    from schemas import Observation, RequestCompleted

COLUMNS = (
    "ts",
    "kind",
    "request_id",
    "caller_id",
    "org",
    "surface",
    "requested_model",
    "model",
    "endpoint",
    "credential_id",
    "status",
    "outcome",
    "error_kind",
    "fallback",
    "attempt",
    "ttft_ms",
    "latency_ms",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "stream",
    "cost_usd",
    "cost_estimated",
    "key_id",
    "user_id",
    "trace_id",
)
_BOOLS = frozenset({"fallback", "stream", "cost_estimated"})
ADDED_COLUMNS = {
    "cost_usd": "REAL NOT NULL DEFAULT 0",
    "cost_estimated": "INTEGER NOT NULL DEFAULT 0",
    "key_id": "TEXT NOT NULL DEFAULT ''",
    "user_id": "TEXT NOT NULL DEFAULT ''",
    "trace_id": "TEXT NOT NULL DEFAULT ''",
}
"""Columns added after the first release: a file made before them gets them at start
(:func:`upgrade`), and a reader of such a file sees their defaults."""
_DEFAULTS = {
    "cost_usd": "0.0",
    "cost_estimated": "0",
    "key_id": "''",
    "user_id": "''",
    "trace_id": "''",
}

REQUEST_LOG = Migration(
    "request_log",
    (
        "CREATE TABLE IF NOT EXISTS request_log ("
        " id INTEGER PRIMARY KEY, ts REAL NOT NULL, kind TEXT NOT NULL,"
        " request_id TEXT NOT NULL, caller_id TEXT NOT NULL, org TEXT NOT NULL,"
        " surface TEXT NOT NULL, requested_model TEXT NOT NULL, model TEXT NOT NULL,"
        " endpoint TEXT NOT NULL, credential_id TEXT NOT NULL, status INTEGER,"
        " outcome TEXT NOT NULL, error_kind TEXT NOT NULL, fallback INTEGER NOT NULL,"
        " attempt INTEGER NOT NULL, ttft_ms REAL, latency_ms REAL NOT NULL,"
        " prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,"
        " cached_tokens INTEGER NOT NULL, stream INTEGER NOT NULL)",
        "CREATE INDEX IF NOT EXISTS request_log_ts ON request_log (ts)",
        "CREATE INDEX IF NOT EXISTS request_log_request ON request_log (request_id)",
    ),
)


LOG_SENDERS = Migration(
    "log_senders",
    (
        "CREATE TABLE IF NOT EXISTS log_senders ("
        " sender TEXT PRIMARY KEY, seq INTEGER NOT NULL, ts REAL NOT NULL)",
    ),
)
"""The last committed ``LogAppend`` batch of each sender (an ingress process), written in the
batch's own transaction: a batch sent again after its answer was lost is recognised."""
SENDER_SEQ = "SELECT seq FROM log_senders WHERE sender = ?"
SENDER_UPSERT = (
    "INSERT INTO log_senders (sender, seq, ts) VALUES (?, ?, ?)"
    " ON CONFLICT (sender) DO UPDATE SET seq = excluded.seq, ts = excluded.ts"
)
PRUNE_SENDERS = "DELETE FROM log_senders WHERE ts < ?"


def missing_columns(present: set[str]) -> list[str]:
    """The statements that add the :data:`ADDED_COLUMNS` a table with ``present`` lacks."""
    return [
        f"ALTER TABLE request_log ADD COLUMN {name} {decl}"
        for name, decl in ADDED_COLUMNS.items()
        if name not in present
    ]


TABLE_INFO = "SELECT name FROM pragma_table_info('request_log')"

INSERT = (
    f"INSERT INTO request_log ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"
)
PRUNE = "DELETE FROM request_log WHERE ts < ?"

Row = tuple[Any, ...]


def unwritable(row: Row) -> str | None:
    """The first column of ``row`` a database may refuse (an integer past 64 bits, a float
    that is not finite, text with a NUL, which PostgreSQL refuses, anything but text, numbers
    and null), or None. Such a row would fail its whole batch's write every time it is sent."""
    for name, value in zip(COLUMNS, row, strict=True):
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, str):
            if "\x00" in value:
                return name
            continue
        if isinstance(value, int):
            ok = fits_int64(value)
        else:
            ok = isinstance(value, float) and math.isfinite(value)
        if not ok:
            return name
    return None


def caller_id(caller: str) -> str:
    """The pseudonymous id a caller is logged under ("" for none)."""
    return "c-" + hashlib.sha256(caller.encode()).hexdigest()[:12] if caller else ""


def attempt_row(obs: Observation) -> Row:
    """The row of one upstream attempt."""
    prompt, completion = priced_tokens(obs)  # the estimate when it was priced on one
    return (
        obs.ts,
        "attempt",
        obs.request_id,
        caller_id(obs.caller),
        "",
        obs.surface,
        "",
        obs.model,
        obs.endpoint,
        obs.credential_id,
        obs.status,
        obs.outcome,
        obs.error_kind,
        int(obs.fallback),
        obs.attempt,
        obs.ttft_ms,
        obs.latency_ms,
        prompt,
        completion,
        obs.cached_tokens,
        int(obs.stream),
        obs.cost_usd,
        int(obs.cost_estimated),
        "",
        "",
        obs.trace_id,
    )


def request_row(done: RequestCompleted) -> Row:
    """The row of one client request (``attempt`` holds its number of attempts)."""
    if done.status == 499:
        outcome = "cancelled"
    elif done.status >= 400 or done.error_kind:
        outcome = "error"
    else:
        outcome = "success"
    return (
        done.ts,
        "request",
        done.request_id,
        caller_id(done.caller),
        done.org,
        done.surface,
        done.requested_model,
        done.model,
        done.endpoint,
        done.credential_id,
        done.status,
        outcome,
        done.error_kind,
        int(done.fallback),
        done.attempts,
        done.ttft_ms,
        done.latency_ms,
        done.prompt_tokens,
        done.completion_tokens,
        done.cached_tokens,
        int(done.stream),
        done.cost_usd,
        int(done.cost_estimated),
        done.key_id,
        f"{done.org}/{done.user}" if done.user else "",
        done.trace_id,
    )


def _moment(value: Any, name: str, now: float | None) -> float | None:
    """``value`` (None: absent) as unix seconds between years 1 and 9999. Raises
    InvalidRequestError naming ``name``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidRequestError(
            f"'{name}' must be epoch seconds, an ISO 8601 time or a duration ago", param=name
        )
    try:
        return parse_since(value, time.time() if now is None else now)
    except ValueError as exc:
        raise InvalidRequestError(f"'{name}': {exc}", param=name) from None


@dataclass(frozen=True, slots=True)
class LogQuery:
    """Which rows to read: newer than ``since`` and older than ``until`` (epoch seconds), of
    ``model`` (requested or resolved), of ``kind`` (``request``/``attempt``), of
    ``request_id``, of HTTP ``status``, of ``outcome`` (``success``, ``error``, ``failure``,
    ``cancelled``), of ``caller_id`` (the logged ``c-...`` id); the newest ``limit``, returned
    oldest first."""

    since: float | None = None
    model: str | None = None
    kind: str | None = None
    request_id: str | None = None
    limit: int = 100
    until: float | None = None
    status: int | None = None
    outcome: str | None = None
    caller_id: str | None = None

    @classmethod
    def from_args(cls, args: dict[str, Any], now: float | None = None) -> LogQuery:
        """Build from admin-command arguments (``since``/``until``: epoch seconds, ISO 8601,
        or a duration before ``now``, default the current time). Raises InvalidRequestError
        naming a bad one."""
        since, until = (_moment(args.get(name), name, now) for name in ("since", "until"))
        limit = args.get("limit", 100)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidRequestError("'limit' must be a positive integer", param="limit")
        kind = args.get("kind")
        if kind not in (None, "request", "attempt"):
            raise InvalidRequestError("'kind' must be 'request' or 'attempt'", param="kind")
        status = args.get("status")
        # Bounded: an SQLite INTEGER parameter overflows past 2**63 - 1.
        if status is not None and (
            isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599
        ):
            raise InvalidRequestError(
                "'status' must be an HTTP status code (100 to 599)", param="status"
            )
        texts = {name: args.get(name) for name in ("model", "request_id", "outcome", "caller_id")}
        for name, value in texts.items():
            if value is not None and not isinstance(value, str):
                raise InvalidRequestError(f"'{name}' must be a string", param=name)
        return cls(
            since=since,
            model=texts["model"],
            kind=kind,
            request_id=texts["request_id"],
            limit=min(limit, 10_000),
            until=until,
            status=status,
            outcome=texts["outcome"] or None,
            caller_id=texts["caller_id"] or None,
        )

    def sql(self, present: set[str] | None = None) -> tuple[str, list[Any]]:
        """The SELECT and its parameters (``present``: the table's columns, when it may be
        older than :data:`ADDED_COLUMNS`)."""
        where: list[str] = []
        params: list[Any] = []
        if self.since is not None:
            where.append("ts >= ?")
            params.append(self.since)
        if self.model:
            where.append("(model = ? OR requested_model = ?)")
            params += [self.model, self.model]
        if self.kind:
            where.append("kind = ?")
            params.append(self.kind)
        if self.request_id:
            where.append("request_id = ?")
            params.append(self.request_id)
        if self.until is not None:
            where.append("ts < ?")
            params.append(self.until)
        for column, value in (
            ("status", self.status),
            ("outcome", self.outcome),
            ("caller_id", self.caller_id),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        cols = (
            COLUMNS
            if present is None
            else tuple(c if c in present else f"{_DEFAULTS[c]} AS {c}" for c in COLUMNS)
        )
        sql = f"SELECT {', '.join(cols)} FROM request_log{clause} ORDER BY ts DESC, id DESC LIMIT ?"
        return sql, [*params, self.limit]


def as_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    """Rows from :meth:`LogQuery.sql` as dicts, oldest first."""
    out = []
    for row in reversed(rows):
        d = dict(zip(COLUMNS, row, strict=True))
        for key in _BOOLS:
            d[key] = bool(d[key])
        out.append(d)
    return out
