"""Spend aggregates of the request log, and the summary its owner answers (``spend report``).

The StoreActor keeps ``spend_hourly``: per UTC hour, key, user, organisation and model, the
requests, prompt and completion tokens, USD and estimated requests, added up in the same
transaction that writes the request rows (:func:`hourly_upserts`). A report reads whole
hours from the aggregates and only the partial hours at its edges from the log itself, so
its cost does not grow with the traffic of the range.

``{since?, until?, group_by?}``: ``since``/``until`` are epoch seconds, ISO 8601 times (UTC
unless they carry an offset) or durations ago (``10m``, ``2h``, ``7d``; default: the last 30
days up to now), ``group_by`` one of
``key``, ``user``, ``org``, ``model`` (default ``model``). One row per group over the client
requests in ``[since, until)``, the dearest first; with ``per_day: true`` also ``days``, the
same sums per UTC day and group (from the same aggregates: a day is 24 of their hours).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from actors.stores.db import Migration
from actors.stores.request_log import COLUMNS, Row
from schemas import InvalidRequestError
from schemas.keys import parse_since

if TYPE_CHECKING:
    from collections.abc import Iterable

HOUR_S = 3600
DAY_S = 86_400
GROUPS = {"key": "key_id", "user": "user_id", "org": "org", "model": "model"}
SPEND_ARGS = frozenset({"since", "until", "group_by", "per_day"})
"""The arguments a ``spend report`` takes (:meth:`SpendQuery.from_args` reads them)."""
_DEFAULT_SPAN_S = 30 * 86_400
_SUMS = ("requests", "prompt_tokens", "completion_tokens", "cost_usd", "estimated_requests")

SPEND_HOURLY = Migration(
    "spend_hourly",
    (
        "CREATE TABLE IF NOT EXISTS spend_hourly ("
        " hour INTEGER NOT NULL, key_id TEXT NOT NULL, user_id TEXT NOT NULL,"
        " org TEXT NOT NULL, model TEXT NOT NULL, requests INTEGER NOT NULL,"
        " prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,"
        " cost_usd REAL NOT NULL, estimated_requests INTEGER NOT NULL,"
        " PRIMARY KEY (hour, key_id, user_id, org, model))",
    ),
)
# The old values qualified by the table's name: PostgreSQL finds a bare name ambiguous.
UPSERT = (
    "INSERT INTO spend_hourly VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (hour, key_id, user_id, org, model) DO UPDATE SET"
    " requests = spend_hourly.requests + excluded.requests,"
    " prompt_tokens = spend_hourly.prompt_tokens + excluded.prompt_tokens,"
    " completion_tokens = spend_hourly.completion_tokens + excluded.completion_tokens,"
    " cost_usd = spend_hourly.cost_usd + excluded.cost_usd,"
    " estimated_requests = spend_hourly.estimated_requests + excluded.estimated_requests"
)
BACKFILL = (
    "INSERT INTO spend_hourly SELECT CAST(ts / 3600 AS INTEGER), key_id, user_id, org, model,"
    " COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), SUM(cost_usd),"
    " SUM(cost_estimated) FROM request_log WHERE kind = 'request'"
    " GROUP BY CAST(ts / 3600 AS INTEGER), key_id, user_id, org, model"
)
"""Builds the aggregates of a log written before they existed (run once, when empty)."""
PRUNE_HOURLY = "DELETE FROM spend_hourly WHERE hour < ?"

_I = {
    name: COLUMNS.index(name)
    for name in (
        "ts",
        "kind",
        "key_id",
        "user_id",
        "org",
        "model",
        "prompt_tokens",
        "completion_tokens",
        "cost_usd",
        "cost_estimated",
    )
}


def hourly_upserts(rows: Iterable[Row]) -> list[tuple[Any, ...]]:
    """The ``UPSERT`` parameters adding a batch's request rows to the hourly aggregates."""
    acc: dict[tuple[Any, ...], list[float]] = defaultdict(lambda: [0, 0, 0, 0.0, 0])
    for row in rows:
        if row[_I["kind"]] != "request":
            continue
        key = (
            int(row[_I["ts"]] // HOUR_S),
            row[_I["key_id"]],
            row[_I["user_id"]],
            row[_I["org"]],
            row[_I["model"]],
        )
        sums = acc[key]
        sums[0] += 1
        sums[1] += row[_I["prompt_tokens"]]
        sums[2] += row[_I["completion_tokens"]]
        sums[3] += row[_I["cost_usd"]]
        sums[4] += row[_I["cost_estimated"]]
    return [(*key, *sums) for key, sums in acc.items()]


def _instant(value: Any, name: str, now: float) -> float:
    """``value`` as unix seconds between years 1 and 9999. Raises InvalidRequestError naming
    ``name``."""
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            return parse_since(value, now)
        except ValueError as exc:
            raise InvalidRequestError(f"'{name}': {exc}", param=name) from None
    raise InvalidRequestError(
        f"'{name}' must be epoch seconds, an ISO 8601 time or a duration ago", param=name
    )


@dataclass(frozen=True, slots=True)
class SpendQuery:
    """One report's range and grouping."""

    since: float
    until: float
    group_by: str
    per_day: bool = False

    @classmethod
    def from_args(cls, args: dict[str, Any], now: float) -> SpendQuery:
        """Build from admin-command arguments. Raises InvalidRequestError naming a bad one."""
        group = args.get("group_by", "model")
        if not isinstance(group, str) or group not in GROUPS:
            raise InvalidRequestError(
                f"'group_by' must be one of {', '.join(GROUPS)}", param="group_by"
            )
        until = _instant(args["until"], "until", now) if args.get("until") is not None else now
        since = (
            _instant(args["since"], "since", now)
            if args.get("since") is not None
            else until - _DEFAULT_SPAN_S
        )
        if since >= until:
            raise InvalidRequestError("'since' must be before 'until'", param="since")
        per_day = args.get("per_day", False)
        if not isinstance(per_day, bool):
            raise InvalidRequestError("'per_day' must be true or false", param="per_day")
        return cls(since, until, str(group), per_day)

    def queries(self) -> list[tuple[str, list[Any]]]:
        """The SELECTs whose rows :meth:`result` adds up: whole hours from the aggregates,
        the partial hours at the edges from the log (by its ``ts`` index)."""
        col = GROUPS[self.group_by]
        # Per day, the day leads each row (0 otherwise): an hour's day is hour / 24. A row's
        # day divides whole seconds: PostgreSQL rounds a cast of ts / 86400 (SQLite truncates).
        raw_day, hourly_day = (
            ("CAST(ts AS BIGINT) / 86400", "hour / 24")
            if self.per_day
            else (
                "0",
                "0",
            )
        )
        first = math.ceil(self.since / HOUR_S)  # the first whole hour inside the range
        last = math.floor(self.until / HOUR_S)  # the hour after the last whole one
        raw = (
            f"SELECT {raw_day}, {col}, COUNT(*), SUM(prompt_tokens), SUM(completion_tokens),"
            " SUM(cost_usd), SUM(cost_estimated) FROM request_log"
            f" WHERE ts >= ? AND ts < ? AND kind = 'request' GROUP BY 1, {col}"
        )
        if first >= last:  # no whole hour inside: all from the log
            return [(raw, [self.since, self.until])]
        return [
            (
                f"SELECT {hourly_day}, {col}, SUM(requests), SUM(prompt_tokens),"
                " SUM(completion_tokens), SUM(cost_usd), SUM(estimated_requests)"
                f" FROM spend_hourly WHERE hour >= ? AND hour < ? GROUP BY 1, {col}",
                [first, last],
            ),
            (raw, [self.since, first * HOUR_S]),
            (raw, [last * HOUR_S, self.until]),
        ]

    def result(self, rows: Iterable[tuple[Any, ...]]) -> dict[str, Any]:
        """The admin answer: the rows of every query added up per group."""
        acc: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0, 0])
        daily: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0, 0, 0, 0.0, 0])
        for day, name, *sums in rows:
            into, into_day = acc[str(name)], daily[(int(day), str(name))]
            for i, value in enumerate(sums):
                into[i] += value or 0
                into_day[i] += value or 0
        groups = [{self.group_by: name, **_counts(sums)} for name, sums in acc.items()]
        groups.sort(key=lambda g: (-g["cost_usd"], g[self.group_by]))
        out: dict[str, Any] = {
            "since": self.since,
            "until": self.until,
            "group_by": self.group_by,
            "total_usd": sum(g["cost_usd"] for g in groups),
            "groups": groups,
        }
        if self.per_day:
            out["days"] = [
                {"day": day * DAY_S, self.group_by: name, **_counts(sums)}
                for (day, name), sums in sorted(daily.items())
            ]
        return out


def _counts(sums: list[float]) -> dict[str, Any]:
    return {k: float(v) if k == "cost_usd" else int(v) for k, v in zip(_SUMS, sums, strict=True)}
