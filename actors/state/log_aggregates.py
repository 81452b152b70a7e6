"""The request log's live aggregates: requests, errors and TTFT per minute, kept in memory.

Pure state owned by the StoreActor, fed every row it accepts (and, at start, the rows of the
last window from the file), so ``log aggregate`` answers from a few hundred numbers instead of
scanning the table: the dashboard's overview costs the same with ten rows or ten million.

Per endpoint (attempt rows) and for the whole deployment (request rows): a count of rows and
of errors per minute for the last :data:`WINDOW_MINUTES`, and the last :data:`TTFT_SAMPLES`
first-token times within :data:`TTFT_WINDOW_S` for p50/p95. For charts, the same per model
(request rows) too, and each as a time series of the last hour or day
(``actors.state.log_series``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from actors.state.log_series import RANGES, TimeSeries, ttft_bin
from actors.stores.request_log import COLUMNS, Row

WINDOW_MINUTES = 60
TTFT_WINDOW_S = 900.0
TTFT_SAMPLES = 2048
MAX_ENDPOINTS = 1024  # endpoints come from the config; the bound only guards odd rows
MAX_MODELS = 1024  # models too (a request row names the served model, or none)
SEED_SECONDS = 86_400  # the longest range a chart shows: what a restart reads back
GROUPINGS = ("model", "endpoint")
_TS, _KIND, _MODEL, _ENDPOINT, _OUTCOME, _TTFT = (
    COLUMNS.index(c) for c in ("ts", "kind", "model", "endpoint", "outcome", "ttft_ms")
)


@dataclass(slots=True)
class _Series:
    """Rows and errors per minute (minute number -> [rows, errors]) and recent TTFTs."""

    minutes: dict[int, list[int]] = field(default_factory=dict)
    ttft: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=TTFT_SAMPLES))
    over_time: TimeSeries = field(default_factory=TimeSeries)

    def add(self, ts: float, error: bool, ttft_ms: float | None, ttft: int | None) -> None:
        """Count one row at ``ts`` (``ttft``: its first-token time's ``ttft_bin``)."""
        self.over_time.add(ts, error, ttft)
        minute = int(ts // 60)
        counts = self.minutes.get(minute)
        if counts is None:
            counts = self.minutes[minute] = [0, 0]
            oldest = minute - WINDOW_MINUTES
            for m in [m for m in self.minutes if m <= oldest]:
                del self.minutes[m]
        counts[0] += 1
        counts[1] += int(error)
        if ttft_ms is not None:
            self.ttft.append((ts, ttft_ms))

    def view(self, now: float) -> dict[str, Any]:
        last = int(now // 60)
        per_minute = [
            [m * 60, *self.minutes.get(m, (0, 0))]
            for m in range(last - WINDOW_MINUTES + 1, last + 1)
        ]
        recent = sorted(t for ts, t in self.ttft if ts >= now - TTFT_WINDOW_S)
        this = self.minutes.get(last, [0, 0])
        prev = self.minutes.get(last - 1, [0, 0])
        # The last 60 seconds: this minute's rows plus the part of the previous minute still
        # inside them (as if spread evenly), so a rate does not drop to 0 as a minute starts.
        share = 1.0 - (now % 60) / 60
        return {
            "requests_per_minute": round(this[0] + prev[0] * share, 1),
            "errors_per_minute": round(this[1] + prev[1] * share, 1),
            "per_minute": per_minute,
            "ttft_p50_ms": _percentile(recent, 0.50),
            "ttft_p95_ms": _percentile(recent, 0.95),
            "ttft_samples": len(recent),
        }


def _percentile(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class LogAggregates:
    """The aggregates of the rows seen; raises nothing."""

    def __init__(self) -> None:
        self._requests = _Series()
        self._endpoints: dict[str, _Series] = {}
        self._models: dict[str, TimeSeries] = {}

    def add(self, row: Row) -> None:
        """Count one request-log row (as :func:`actors.stores.request_log.attempt_row` makes)."""
        error = row[_OUTCOME] not in ("success", "cancelled")
        ttft = ttft_bin(row[_TTFT])
        if row[_KIND] == "request":
            self._requests.add(row[_TS], error, row[_TTFT], ttft)
            model = str(row[_MODEL])
            per_model = self._models.get(model)
            if per_model is None and model and len(self._models) < MAX_MODELS:
                per_model = self._models[model] = TimeSeries()
            if per_model is not None:
                per_model.add(row[_TS], error, ttft)
            return
        endpoint = str(row[_ENDPOINT])
        series = self._endpoints.get(endpoint)
        if series is None:
            if len(self._endpoints) >= MAX_ENDPOINTS:
                return
            series = self._endpoints[endpoint] = _Series()
        series.add(row[_TS], error, row[_TTFT], ttft)

    def view(self, now: float, over: str | None = None, by: str = "model") -> dict[str, Any]:
        """``requests`` (the whole deployment) and ``endpoints`` (by id), each with its rates
        of the last minute, per-minute counts ``[minute_ts, rows, errors]`` of the window and
        TTFT p50/p95 (ms, None without samples) of the last :data:`TTFT_WINDOW_S`. With
        ``over`` (a range of :data:`~actors.state.log_series.RANGES`), also ``series``: that
        range's points for the deployment (``all``) and per ``by`` (model or endpoint).
        Raises ValueError for an unknown range or grouping."""
        out: dict[str, Any] = {
            "window_minutes": WINDOW_MINUTES,
            "requests": self._requests.view(now),
            "endpoints": {eid: s.view(now) for eid, s in sorted(self._endpoints.items())},
        }
        if over is None:
            return out
        if over not in RANGES:
            raise ValueError(f"'range' must be one of {', '.join(RANGES)}")
        if by not in GROUPINGS:
            raise ValueError(f"'by' must be one of {', '.join(GROUPINGS)}")
        groups = (
            self._models
            if by == "model"
            else {eid: s.over_time for eid, s in self._endpoints.items()}
        )
        out["series"] = {
            "range": over,
            "by": by,
            "bucket_seconds": RANGES[over][0],
            "columns": ["ts", "requests", "errors", "ttft_p50_ms", "ttft_p95_ms"],
            "all": self._requests.over_time.points(over, now),
            "groups": {name: t.points(over, now) for name, t in sorted(groups.items())},
        }
        return out


SEED_SQL = (
    f"SELECT {', '.join(COLUMNS)} FROM request_log WHERE ts >= ? ORDER BY ts DESC, id DESC LIMIT ?"
)
SEED_ROWS = 50_000
"""At start, at most this many of the window's newest rows seed the aggregates."""
