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

from gateway.telemetry.otlp_http import transport_for

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.resources import Resource

    from gateway.telemetry.semconv import Semconv

__all__ = ["GenAIInstruments"]

logger = logging.getLogger(__name__)

TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
SECONDS_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48)
_MAX_SERIES = 8192  # per instrument; attribute values come from the config (bounded anyway)
_SCOPE = InstrumentationScope("llmgw")

_Key = tuple[tuple[str, str], ...]


class _Series:
    """One attribute set's cumulative histogram."""

    __slots__ = ("attributes", "count", "counts", "max", "min", "start", "sum")

    def __init__(self, attributes: dict[str, str], buckets: int) -> None:
        self.attributes = attributes
        self.counts = [0] * buckets
        self.count = 0
        self.sum: float = 0
        self.min, self.max = float("inf"), float("-inf")
        self.start = time.time_ns()


class _Instrument:
    """One histogram instrument: its name, unit, bounds and series."""

    __slots__ = ("bounds", "description", "name", "series", "unit")

    def __init__(self, name: str, unit: str, description: str, bounds: tuple[float, ...]):
        self.name, self.unit, self.description, self.bounds = name, unit, description, bounds
        self.series: dict[_Key, _Series] = {}

    def record(self, key: _Key, attributes: dict[str, str], value: float) -> None:
        """Add ``value`` to the series of ``attributes`` (``key``: their items)."""
        series = self.series.get(key)
        if series is None:
            if len(self.series) >= _MAX_SERIES:
                return
            series = self.series[key] = _Series(attributes, len(self.bounds) + 1)
        series.counts[bisect_left(self.bounds, value)] += 1  # buckets are (lower, upper]
        series.count += 1
        series.sum += value
        if value < series.min:
            series.min = value
        if value > series.max:
            series.max = value

    def metric(self, now: int) -> Metric | None:
        """The instrument's points as of ``now`` (None before its first value)."""
        if not self.series:
            return None
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
        ]
        return Metric(
            name=self.name,
            description=self.description,
            unit=self.unit,
            data=Histogram(
                data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE
            ),
        )


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
        self._attributes: dict[_Key, tuple[dict[str, str], dict[str, str], dict[str, str]]] = {}
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
        key = tuple(labels.items())
        with self._lock:
            found = self._attributes.get(key)
            if found is None:
                found = self._attribute_sets(key, labels)
            attributes, as_input, as_output = found
            self.duration.record(key, attributes, seconds)
            if input_tokens:
                self.tokens.record((*key, ("", "input")), as_input, input_tokens)
            if output_tokens:
                self.tokens.record((*key, ("", "output")), as_output, output_tokens)
            if ttfc is not None:
                self.ttfc.record(key, attributes, ttfc)

    def _attribute_sets(
        self, key: _Key, labels: dict[str, str]
    ) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
        """The attributes of ``labels``' series, and of its input and output token series."""
        attributes = dict(labels)
        if self._old_provider_key and "gen_ai.provider.name" in attributes:
            attributes["gen_ai.system"] = attributes.pop("gen_ai.provider.name")
        found = (
            attributes,
            {**attributes, "gen_ai.token.type": "input"},
            {**attributes, "gen_ai.token.type": "output"},
        )
        if len(self._attributes) < _MAX_SERIES:
            self._attributes[key] = found
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
        self._thread.join()
        self._export()
        self._exporter.shutdown()
