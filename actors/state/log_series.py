"""Time series of the request log for charts: requests, errors and TTFT p50/p95 per bucket.

Pure state the StoreActor owns through :class:`~actors.state.log_aggregates.LogAggregates`,
fed every row it accepts, so a chart of the last hour or day costs a few thousand numbers,
never a scan of the log. Two resolutions (:data:`RANGES`): the last hour in one-minute
buckets and the last day in quarter hours. A bucket holds its rows, its errors and a sparse
histogram of first-token times in bins 10% wide, so its percentiles are within 5% of the
exact ones however many rows it counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

RANGES = {"hour": (60, 60), "day": (900, 96)}
"""Range name -> (bucket width in seconds, buckets kept)."""
_GROWTH = math.log(1.1)  # a histogram bin's width, as a ratio of its bounds


@dataclass(slots=True)
class _Bucket:
    rows: int = 0
    errors: int = 0
    ttft_bins: dict[int, int] = field(default_factory=dict)  # bin -> samples
    samples: int = 0

    def percentile(self, q: float) -> float | None:
        if not self.samples:
            return None
        rank = min(self.samples - 1, int(q * self.samples))
        seen = 0
        for b in sorted(self.ttft_bins):
            seen += self.ttft_bins[b]
            if seen > rank:
                return round(math.exp((b + 0.5) * _GROWTH), 1)  # the bin's geometric middle
        return None  # unreachable: the bins add up to ``samples``


def ttft_bin(ttft_ms: float | None) -> int | None:
    """The histogram bin of a first-token time (None: the row has none). A row is counted
    in several series (the deployment, its model, its endpoint; each at every resolution):
    its bin is found once and handed to each."""
    if ttft_ms is None:
        return None
    return math.floor(math.log(max(ttft_ms, 1.0)) / _GROWTH)


@dataclass(slots=True)
class _Resolution:
    width: int
    count: int
    buckets: dict[int, _Bucket] = field(default_factory=dict)  # bucket number -> counts

    def add(self, ts: float, error: bool, b: int | None) -> None:
        n = int(ts // self.width)
        bucket = self.buckets.get(n)
        if bucket is None:
            bucket = self.buckets[n] = _Bucket()
            oldest = max(self.buckets) - self.count
            for old in [k for k in self.buckets if k <= oldest]:
                del self.buckets[old]
        bucket.rows += 1
        bucket.errors += int(error)
        if b is not None:
            bucket.ttft_bins[b] = bucket.ttft_bins.get(b, 0) + 1
            bucket.samples += 1

    def points(self, now: float) -> list[list[float | int | None]]:
        last = int(now // self.width)
        empty = _Bucket()
        out: list[list[float | int | None]] = []
        for n in range(last - self.count + 1, last + 1):
            b = self.buckets.get(n, empty)
            out.append([n * self.width, b.rows, b.errors, b.percentile(0.5), b.percentile(0.95)])
        return out


@dataclass(slots=True)
class TimeSeries:
    """One series (the deployment, a model or an endpoint) at every resolution of
    :data:`RANGES`; raises nothing."""

    resolutions: dict[str, _Resolution] = field(
        default_factory=lambda: {name: _Resolution(w, c) for name, (w, c) in RANGES.items()}
    )

    def add(self, ts: float, error: bool, ttft: int | None) -> None:
        """Count one row at ``ts`` with its first-token time's :func:`ttft_bin`."""
        for r in self.resolutions.values():
            r.add(ts, error, ttft)

    def points(self, range_name: str, now: float) -> list[list[float | int | None]]:
        """``[bucket_start_ts, rows, errors, ttft_p50_ms, ttft_p95_ms]`` per bucket of the
        range ending at ``now``, oldest first (the percentiles None without samples)."""
        return self.resolutions[range_name].points(now)
