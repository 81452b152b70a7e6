"""The request log's in-memory aggregates: per-minute counts, a bounded window, percentiles."""

from __future__ import annotations

from typing import Any

from actors.state.log_aggregates import WINDOW_MINUTES, LogAggregates
from actors.stores.request_log import COLUMNS, Row


def _row(ts: float, kind: str, outcome: str, ttft: float | None, endpoint: str = "e") -> Row:
    values: dict[str, Any] = dict.fromkeys(COLUMNS, "")
    values.update(ts=ts, kind=kind, outcome=outcome, ttft_ms=ttft, endpoint=endpoint)
    return tuple(values[c] for c in COLUMNS)


def test_counts_errors_and_percentiles_per_endpoint_and_overall() -> None:
    agg = LogAggregates()
    now = 60.0 * 1000 + 1  # just after a minute starts
    for i in range(100):
        agg.add(_row(now - 30, "attempt", "failure" if i < 10 else "success", float(i)))
        agg.add(_row(now - 30, "request", "error" if i < 10 else "success", float(i)))
    view = agg.view(now)
    e = view["endpoints"]["e"]
    assert e["ttft_p50_ms"] == 50.0 and e["ttft_p95_ms"] == 95.0
    assert sum(m[1] for m in e["per_minute"]) == 100
    assert sum(m[2] for m in e["per_minute"]) == 10
    assert 95 < e["requests_per_minute"] <= 100  # the previous minute, nearly all inside
    assert view["requests"]["errors_per_minute"] > 9


def test_minutes_past_the_window_are_dropped_and_no_samples_means_none() -> None:
    agg = LogAggregates()
    agg.add(_row(0.0, "attempt", "success", None))
    later = 60.0 * (WINDOW_MINUTES + 5)
    agg.add(_row(later, "attempt", "success", None))
    view = agg.view(later)["endpoints"]["e"]
    assert sum(m[1] for m in view["per_minute"]) == 1
    assert view["ttft_p50_ms"] is None and view["ttft_samples"] == 0
    assert len(view["per_minute"]) == WINDOW_MINUTES
