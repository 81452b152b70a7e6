"""The request log's in-memory aggregates: per-minute counts, a bounded window, percentiles."""

from __future__ import annotations

from typing import Any

import pytest

from actors.state.log_aggregates import WINDOW_MINUTES, LogAggregates
from actors.stores.request_log import COLUMNS, Row


def _row(
    ts: float, kind: str, outcome: str, ttft: float | None, endpoint: str = "e", model: str = ""
) -> Row:
    values: dict[str, Any] = dict.fromkeys(COLUMNS, "")
    values.update(ts=ts, kind=kind, outcome=outcome, ttft_ms=ttft, endpoint=endpoint, model=model)
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


def test_series_put_errors_and_ttft_in_the_bucket_of_their_time_per_model_and_endpoint() -> None:
    agg = LogAggregates()
    now = 60.0 * 10_000
    at = now - 600  # ten minutes ago: the bucket 50 of the hour's 60
    for i in range(20):
        ttft = 100.0 if i < 11 else 1000.0
        agg.add(_row(at + 5, "request", "error" if i < 4 else "success", ttft, model="m"))
        agg.add(_row(at + 5, "attempt", "failure" if i < 4 else "success", ttft, endpoint="e"))
    agg.add(_row(now - 3 * 3600, "request", "error", None, model="m"))  # in the day only

    hour = agg.view(now, "hour", "model")["series"]
    day = agg.view(now, "day", "endpoint")["series"]

    assert hour["bucket_seconds"] == 60 and len(hour["all"]) == 60
    point = next(p for p in hour["groups"]["m"] if p[1])
    assert point[0] == at - at % 60 and point[1:3] == [20, 4]
    assert abs(point[3] - 100) <= 5 and abs(point[4] - 1000) <= 50  # p50, p95 within 5%
    assert sum(p[1] for p in hour["all"]) == 20  # three hours ago is outside the hour
    assert day["bucket_seconds"] == 900 and len(day["all"]) == 96
    assert sum(p[2] for p in day["all"]) == 5
    assert [p[1:3] for p in day["groups"]["e"] if p[1]] == [[20, 4]]


def test_a_range_or_grouping_it_does_not_keep_is_refused() -> None:
    agg = LogAggregates()
    with pytest.raises(ValueError, match="'range'"):
        agg.view(0.0, "week", "model")
    with pytest.raises(ValueError, match="'by'"):
        agg.view(0.0, "hour", "key")
