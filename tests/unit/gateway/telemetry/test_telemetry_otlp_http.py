"""The OTLP exporters' transport (gateway.telemetry.otlp_http), against the real OTLP/HTTP
receiver: one kept-alive connection, the configured headers and gzip, the SDK's retry on a
503 with ``Retry-After`` (but not once the gateway stops); the SDK's ``requests`` transport
where a proxy applies."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from opentelemetry.exporter.http.transport._requests import RequestsHTTPTransport
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind

from gateway.telemetry.genai_metrics import GenAIInstruments, _metric_exporter
from gateway.telemetry.otlp_http import ConnectionTransport, transport_for
from gateway.telemetry.otlp_wire import WireSpanExporter
from gateway.telemetry.recorded_span import SpanRecorder
from gateway.telemetry.semconv import Semconv
from gateway.telemetry.span_batcher import SpanBatcher

if TYPE_CHECKING:
    import pytest

    from tests.fixtures.otlp import OtlpReceiver


def _spans(count: int) -> list[Any]:  # RecordedSpans, read as ReadableSpans
    provider = TracerProvider(resource=Resource.create({"service.name": "t"}))
    ended = InMemorySpanExporter()
    recorder = SpanRecorder(provider, SimpleSpanProcessor(ended), InstrumentationScope("llmgw"))
    spans = []
    for n in range(count):
        span = recorder.root(f"span {n}", SpanKind.SERVER, None, {"n": n})
        span.end()
        spans.append(span)
    return spans


async def test_exports_share_one_connection_with_the_configured_headers_and_gzip(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=acme,authorization=Bearer%20t0k")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    exporter: Any = WireSpanExporter()
    spans = _spans(3)

    results = [await asyncio.to_thread(exporter.export, [span]) for span in spans]
    exporter.shutdown()

    assert isinstance(exporter._client._transport, ConnectionTransport)
    assert results == [SpanExportResult.SUCCESS] * 3
    assert len(set(otlp_receiver.peers)) == 1  # three posts, one connection
    for headers in otlp_receiver.headers:
        assert headers["x-tenant"] == "acme"
        assert headers["authorization"] == "Bearer t0k"
        assert headers["content-type"] == "application/x-protobuf"
        assert headers["content-encoding"] == "gzip"
    assert [s.name for s in otlp_receiver.spans] == ["span 0", "span 1", "span 2"]


async def test_a_503_with_retry_after_is_retried_and_the_batch_arrives_once(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)
    otlp_receiver.refusals.append((503, {"Retry-After": "0"}))
    exporter: Any = WireSpanExporter()

    result = await asyncio.to_thread(exporter.export, _spans(2))
    exporter.shutdown()

    assert result is SpanExportResult.SUCCESS
    assert len(otlp_receiver.headers) == 2  # refused, then taken
    assert [s.name for s in otlp_receiver.spans] == ["span 0", "span 1"]
    decoded = ExportTraceServiceRequest.FromString(otlp_receiver.raw[0])
    assert len(decoded.resource_spans[0].scope_spans[0].spans) == 2


_HOUR_MS = 3_600_000  # a schedule that never comes round in a test: only the stop exports
_REFUSING = (503, {"Retry-After": "1"})  # retried until the exporter's 10 s timeout, if let


async def test_a_stop_posts_the_last_spans_once_to_a_refusing_collector(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)
    otlp_receiver.refusals.extend([_REFUSING] * 20)
    batcher = SpanBatcher(WireSpanExporter(), schedule_delay_millis=_HOUR_MS)
    for span in _spans(2):
        batcher.on_end(span)

    await asyncio.to_thread(batcher.shutdown)

    assert len(otlp_receiver.headers) == 1  # one try, no retry to hold the stop
    assert otlp_receiver.spans == []


async def test_a_stop_posts_the_last_metrics_once_to_a_refusing_collector(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)
    otlp_receiver.refusals.extend([_REFUSING] * 20)
    instruments = GenAIInstruments(Resource.create({}), Semconv(), 3600.0, _metric_exporter())
    instruments.record({"gen_ai.operation.name": "chat"}, 0.5, 10, 5, None)

    await asyncio.to_thread(instruments.shutdown)

    assert len(otlp_receiver.headers) == 1
    assert otlp_receiver.metric_names == set()


async def test_a_400_is_not_retried(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)
    otlp_receiver.refusals.append((400, {}))
    exporter: Any = WireSpanExporter()

    result = await asyncio.to_thread(exporter.export, _spans(1))
    exporter.shutdown()

    assert result is SpanExportResult.FAILURE
    assert len(otlp_receiver.headers) == 1
    assert otlp_receiver.spans == []


async def test_a_dropped_connection_is_reopened(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)
    exporter: Any = WireSpanExporter()
    transport = exporter._client._transport
    assert isinstance(transport, ConnectionTransport)
    first, second = _spans(2)

    assert await asyncio.to_thread(exporter.export, [first]) is SpanExportResult.SUCCESS
    conn = transport._conn
    assert conn is not None and conn.sock is not None
    conn.sock.close()  # as a collector's idle timeout would
    assert await asyncio.to_thread(exporter.export, [second]) is SpanExportResult.SUCCESS
    exporter.shutdown()

    assert [s.name for s in otlp_receiver.spans] == ["span 0", "span 1"]


def test_a_proxy_from_the_environment_keeps_the_sdks_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.internal:4318")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)

    assert transport_for("TRACES") is None
    exporter: Any = WireSpanExporter()
    assert isinstance(exporter._client._transport, RequestsHTTPTransport)
    exporter.shutdown()

    monkeypatch.setenv("NO_PROXY", "collector.internal")
    assert isinstance(transport_for("TRACES"), ConnectionTransport)
    metrics: Any = _metric_exporter()
    assert isinstance(metrics._client._transport, ConnectionTransport)


def test_a_credential_provider_keeps_the_sdks_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER", "vault")

    assert transport_for("TRACES") is None
    assert isinstance(transport_for("METRICS"), ConnectionTransport)
