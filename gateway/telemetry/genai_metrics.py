"""The GenAI client metrics over OTLP: cumulative explicit-bucket histograms kept here.

The SDK's synchronous ``Histogram.record`` costs about 8 µs a value (a Measurement object, the
attributes hashed and sorted on every call, view matching); an attempt records three or four.
Here a value costs a dict lookup, a bisect and a few additions under one uncontended lock,
and a thread of this class's own hands the SDK's OTLP/HTTP metric exporter the SDK's own
``MetricsData`` every interval (and once more at shutdown). The points are what the SDK's
default histogram aggregation would report (a test feeds both the same values): cumulative
temporality, per-series start time, bucket counts, sum, min and max.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from typing import TYPE_CHECKING

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from gateway.telemetry.otlp_http import stop_retrying, transport_for

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.resources import Resource

    from gateway.telemetry.semconv import Semconv

__all__ = ["AttemptSeries", "GenAIInstruments"]

logger = logging.getLogger(__name__)

TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
SECONDS_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48)
_MAX_SERIES = 8192  # per instrument; attribute values come from the config (bounded anyway)
_SCOPE = InstrumentationScope("llmgw")

_Key = tuple[tuple[str, str], ...]


class _Series:
    """One attribute set's cumulative histogram (reported from its first value, which
    starts it)."""

    __slots__ = ("attributes", "bounds", "count", "counts", "max", "min", "start", "sum")

    def __init__(self, attributes: dict[str, str], bounds: tuple[float, ...]) -> None:
        self.attributes, self.bounds = attributes, bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum: float = 0
        self.min, self.max = float("inf"), float("-inf")
        self.start = 0

    def add(self, value: float) -> None:
        """Count ``value`` (under the instruments' lock)."""
        if not self.count:
            self.start = time.time_ns()
        self.counts[bisect_left(self.bounds, value)] += 1  # buckets are (lower, upper]
        self.count += 1
        self.sum += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value


class _Instrument:
    """One histogram instrument: its name, unit, bounds and series."""

    __slots__ = ("bounds", "description", "name", "series", "unit")

    def __init__(self, name: str, unit: str, description: str, bounds: tuple[float, ...]):
        self.name, self.unit, self.description, self.bounds = name, unit, description, bounds
        self.series: dict[_Key, _Series] = {}

    def series_of(self, key: _Key, attributes: dict[str, str]) -> _Series:
        """The series of ``attributes`` (``key``: their items); past the bound, one that is
        never reported."""
        series = self.series.get(key)
        if series is None:
            series = _Series(attributes, self.bounds)
            if len(self.series) < _MAX_SERIES:
                self.series[key] = series
        return series

    def metric(self, now: int) -> Metric | None:
        """The instrument's points as of ``now`` (None before its first value)."""
        points = [
            HistogramDataPoint(
                attributes=s.attributes,
                start_time_unix_nano=s.start,
                time_unix_nano=now,
                count=s.count,
                sum=s.sum,
                bucket_counts=list(s.counts),
                explicit_bounds=self.bounds,
                min=s.min,
                max=s.max,
            )
            for s in self.series.values()
            if s.count
        ]
        if not points:
            return None
        return Metric(
            name=self.name,
            description=self.description,
            unit=self.unit,
            data=Histogram(
                data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE
            ),
        )


class AttemptSeries:
    """The series one attribute set's attempts update, resolved once: the duration, input
    and output tokens, and time to first chunk (owned by GenAIInstruments, which reports
    them)."""

    __slots__ = ("_duration", "_input", "_lock", "_output", "_ttfc")

    def __init__(
        self, lock: threading.Lock, duration: _Series, inp: _Series, out: _Series, ttfc: _Series
    ) -> None:
        self._lock, self._duration, self._input, self._output, self._ttfc = (
            lock,
            duration,
            inp,
            out,
            ttfc,
        )

    def record(
        self, seconds: float, input_tokens: int, output_tokens: int, ttfc: float | None
    ) -> None:
        """Record one attempt (zero token counts are not values: no point for them)."""
        with self._lock:
            self._duration.add(seconds)
            if input_tokens:
                self._input.add(input_tokens)
            if output_tokens:
                self._output.add(output_tokens)
            if ttfc is not None:
                self._ttfc.add(ttfc)


def _metric_exporter() -> OTLPMetricExporter:
    """The SDK's OTLP/HTTP metric exporter, on a kept-alive connection where it can be."""
    transport = transport_for("METRICS")
    return OTLPMetricExporter() if transport is None else OTLPMetricExporter(_transport=transport)


class GenAIInstruments:
    """The GenAI client metrics (``/metrics`` has the same in Prometheus naming,
    gateway/ingress/metrics.py); attribute values come from the config only. Owns the
    histograms and the thread that exports them every ``interval`` seconds."""

    def __init__(
        self,
        resource: Resource,
        semconv: Semconv,
        interval: float,
        exporter: MetricExporter | None = None,
    ) -> None:
        self._resource = resource
        self._old_provider_key = not semconv.genai_latest
        self.duration = _Instrument(
            "gen_ai.client.operation.duration",
            "s",
            "GenAI operation duration (one upstream attempt)",
            SECONDS_BUCKETS,
        )
        self.tokens = _Instrument(
            "gen_ai.client.token.usage",
            "{token}",
            "Tokens used per upstream attempt, by gen_ai.token.type",
            TOKEN_BUCKETS,
        )
        self.ttfc = _Instrument(
            "gen_ai.client.operation.time_to_first_chunk",
            "s",
            "Time to the first chunk of a streamed answer",
            SECONDS_BUCKETS,
        )
        self._handles: dict[_Key, AttemptSeries] = {}
        self._lock = threading.Lock()
        self._exporter = exporter if exporter is not None else _metric_exporter()
        self._interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmgw-genai-metrics", daemon=True)
        self._thread.start()

    def record(
        self,
        labels: dict[str, str],
        seconds: float,
        input_tokens: int,
        output_tokens: int,
        ttfc: float | None,
    ) -> None:
        """Record one attempt (``labels``: the operation's bounded attributes, named as the
        latest conventions name them)."""
        self.series(labels).record(seconds, input_tokens, output_tokens, ttfc)

    def series(self, labels: dict[str, str]) -> AttemptSeries:
        """The series one attempt of ``labels`` updates (kept: callers may keep it too)."""
        key = tuple(labels.items())
        with self._lock:
            found = self._handles.get(key)
            if found is None:
                attributes = dict(labels)
                if self._old_provider_key and "gen_ai.provider.name" in attributes:
                    attributes["gen_ai.system"] = attributes.pop("gen_ai.provider.name")
                found = AttemptSeries(
                    self._lock,
                    self.duration.series_of(key, attributes),
                    self.tokens.series_of(
                        (*key, ("", "input")), {**attributes, "gen_ai.token.type": "input"}
                    ),
                    self.tokens.series_of(
                        (*key, ("", "output")), {**attributes, "gen_ai.token.type": "output"}
                    ),
                    self.ttfc.series_of(key, attributes),
                )
                if len(self._handles) < _MAX_SERIES:
                    self._handles[key] = found
        return found

    def collect(self) -> MetricsData | None:
        """Every series as of now, in the SDK's data model (None before the first value)."""
        now = time.time_ns()
        with self._lock:
            found = [i.metric(now) for i in (self.duration, self.tokens, self.ttfc)]
        metrics = [m for m in found if m is not None]
        if not metrics:
            return None
        scope = ScopeMetrics(scope=_SCOPE, metrics=metrics, schema_url="")
        return MetricsData(
            resource_metrics=[
                ResourceMetrics(resource=self._resource, scope_metrics=[scope], schema_url="")
            ]
        )

    def _export(self) -> None:
        data = self.collect()
        if data is None:
            return
        try:
            self._exporter.export(data)
        except Exception:  # an export must never end the thread: the next one may succeed
            logger.exception("GenAI metrics export failed")

    def _run(self) -> None:
        while not self._stopped.wait(self._interval):
            self._export()

    def shutdown(self) -> None:
        """Export a last time and stop (blocking: call from a worker thread)."""
        self._stopped.set()
        stop_retrying(self._exporter)  # a gone collector must not hold the stop
        self._thread.join()
        self._export()
        self._exporter.shutdown()
