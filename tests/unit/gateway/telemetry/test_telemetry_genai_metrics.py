"""The GenAI histograms (gateway.telemetry.genai_metrics) report what the SDK's own
histogram instruments report for the same values, and export through a real exporter."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.resources import Resource

from gateway.telemetry.genai_metrics import SECONDS_BUCKETS, TOKEN_BUCKETS, GenAIInstruments
from gateway.telemetry.semconv import Semconv

if TYPE_CHECKING:
    from collections.abc import Sequence

_LABELS = (
    {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "up-a",
        "llmgw.endpoint": "a",
    },
    {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "up-b",
        "llmgw.endpoint": "b",
        "error.type": "upstream_timeout",
    },
)
# (labels, seconds, input tokens, output tokens, ttfc): bucket edges, zeros, the overflow
_ATTEMPTS = [
    (0, 0.01, 10, 5, None),
    (0, 0.0100001, 0, 7, 0.02),
    (1, 30.0, 4194304, 0, None),
    (0, 0.5, 4194305, 1, 0.0),
    (1, 0.0, 1, 0, 25.0),
    (0, 0.01, 16, 64, 0.32),
]


class _Collected(MetricExporter):
    """An exporter that keeps what it is handed (the SDK's exporter interface)."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[MetricsData] = []

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def _sdk_points(semconv: Semconv) -> dict[str, set[tuple[Any, ...]]]:
    """The same values through the SDK's histograms, as the old record() sent them."""
    reader = InMemoryMetricReader()
    meter = MeterProvider(metric_readers=[reader]).get_meter("llmgw")
    duration = meter.create_histogram(
        "gen_ai.client.operation.duration", explicit_bucket_boundaries_advisory=SECONDS_BUCKETS
    )
    tokens = meter.create_histogram(
        "gen_ai.client.token.usage", explicit_bucket_boundaries_advisory=TOKEN_BUCKETS
    )
    ttfc = meter.create_histogram(
        "gen_ai.client.operation.time_to_first_chunk",
        explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
    )
    for which, seconds, inp, out, first in _ATTEMPTS:
        labels = dict(_LABELS[which])
        if not semconv.genai_latest:
            labels["gen_ai.system"] = labels.pop("gen_ai.provider.name")
        duration.record(seconds, labels)
        if inp:
            tokens.record(inp, {**labels, "gen_ai.token.type": "input"})
        if out:
            tokens.record(out, {**labels, "gen_ai.token.type": "output"})
        if first is not None:
            ttfc.record(first, labels)
    data = reader.get_metrics_data()
    assert data is not None
    return _points(data)


def _points(data: MetricsData) -> dict[str, set[tuple[Any, ...]]]:
    out: dict[str, set[tuple[Any, ...]]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points: Sequence[Any] = m.data.data_points
                out[m.name] = {
                    (
                        tuple(sorted(dict(p.attributes or {}).items())),
                        p.count,
                        p.sum,
                        tuple(p.bucket_counts),
                        tuple(p.explicit_bounds),
                        p.min,
                        p.max,
                    )
                    for p in points
                }
    return out


def _ours(semconv: Semconv) -> tuple[GenAIInstruments, _Collected]:
    exporter = _Collected()
    instruments = GenAIInstruments(Resource.create({}), semconv, 3600.0, exporter)
    for which, seconds, inp, out, first in _ATTEMPTS:
        instruments.record(_LABELS[which], seconds, inp, out, first)
    return instruments, exporter


def test_points_equal_the_sdk_histograms_for_both_convention_choices() -> None:
    for semconv in (Semconv(), Semconv(genai_latest=True)):
        instruments, _ = _ours(semconv)
        collected = instruments.collect()
        instruments.shutdown()

        assert collected is not None
        assert _points(collected) == _sdk_points(semconv)


def test_shutdown_exports_the_points_once_more_and_stops_the_thread() -> None:
    instruments, exporter = _ours(Semconv())

    instruments.shutdown()

    assert len(exporter.batches) == 1
    assert _points(exporter.batches[0]) == _sdk_points(Semconv())
    assert not instruments._thread.is_alive()
