"""The gateway's spans are encoded as they end (gateway.telemetry.otlp_wire.WireSpanExporter.
encode_early through gateway.telemetry.span_batcher): the queue holds bytes, so no span
record or attribute dict outlives its request waiting for a batch (the collector's work and
full collections grew with them); the bytes exported are those of the spans encoded at export;
a span that cannot be encoded is dropped alone; another tracer's spans still go as they are."""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import TYPE_CHECKING, Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind

from gateway.telemetry import start_telemetry
from gateway.telemetry.otlp_wire import SpanEncoder, WireSpanExporter
from gateway.telemetry.recorded_span import RecordedSpan, SpanRecorder
from gateway.telemetry.span_batcher import SpanBatcher
from schemas.config import GatewayConfig

if TYPE_CHECKING:
    import pytest

    from tests.fixtures.otlp import OtlpReceiver

_HOUR_MS = 3_600_000  # a schedule delay that never passes in a test


def _telemetry(
    endpoint: str, monkeypatch: pytest.MonkeyPatch, queue: int = 1000
) -> tuple[TracerProvider, SpanBatcher, SpanRecorder]:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": "t"}))
    exporter = WireSpanExporter()
    batcher = SpanBatcher(
        exporter,
        max_queue_size=queue,
        schedule_delay_millis=_HOUR_MS,
        max_export_batch_size=512,
        early=exporter.encode_early,
    )
    provider.add_span_processor(batcher)
    return provider, batcher, SpanRecorder(provider, batcher, InstrumentationScope("llmgw"))


def _request(recorder: SpanRecorder, n: int, **extra: Any) -> None:
    root = recorder.root("POST /v1/chat/completions", SpanKind.SERVER, None, {"n": n})
    attempt = root.child("chat up-m", SpanKind.CLIENT, {"gen_ai.request.model": "up-m", **extra})
    attempt.end()
    root.end()


def _live_records() -> int:
    return sum(type(o) is RecordedSpan for o in gc.get_objects())


async def test_ended_spans_waiting_for_their_batch_keep_no_record_alive(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, _, recorder = _telemetry(otlp_receiver.endpoint, monkeypatch)
    before = _live_records()
    for n in range(100):
        _request(recorder, n)
    assert _live_records() == before  # 200 spans queued, as bytes

    await asyncio.to_thread(provider.shutdown)  # posts to the receiver on this loop
    assert len(otlp_receiver.spans) == 200
    assert {s.name for s in otlp_receiver.spans} == {"POST /v1/chat/completions", "chat up-m"}


async def test_the_bytes_sent_are_the_spans_encoded_at_export(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, batcher, recorder = _telemetry(otlp_receiver.endpoint, monkeypatch)
    kept: list[RecordedSpan] = []
    original = batcher._early
    assert original is not None

    def keep(span: Any) -> bytes | None:
        kept.append(span)
        return original(span)

    batcher._early = keep
    for n in range(3):
        _request(recorder, n, **{"llmgw.attempt": n})
    await asyncio.to_thread(provider.shutdown)

    sent = ExportTraceServiceRequest.FromString(otlp_receiver.raw[0])
    assert sent == ExportTraceServiceRequest.FromString(SpanEncoder().encode(kept))
    (resource_spans,) = sent.resource_spans
    (scope_spans,) = resource_spans.scope_spans
    assert scope_spans.scope.name == "llmgw"
    assert len(scope_spans.spans) == 6


async def test_a_span_that_cannot_be_encoded_is_dropped_alone(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    provider, _, recorder = _telemetry(otlp_receiver.endpoint, monkeypatch)
    with caplog.at_level(logging.ERROR, logger="gateway.telemetry.span_batcher"):
        _request(recorder, 0, bad=object())  # no OTLP type: that attempt span only
        _request(recorder, 1)
    await asyncio.to_thread(provider.shutdown)

    names = [s.name for s in otlp_receiver.spans]
    assert names == ["POST /v1/chat/completions", "chat up-m", "POST /v1/chat/completions"]
    assert "span not encoded" in caplog.text


async def test_another_tracers_spans_with_links_go_beside_the_encoded_ones(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, _, recorder = _telemetry(otlp_receiver.endpoint, monkeypatch)
    _request(recorder, 0)
    tracer = provider.get_tracer("other")
    with tracer.start_as_current_span("plain"):
        pass
    first = tracer.start_span("first")
    first.end()
    tracer.start_span("linked", links=[Link(first.get_span_context())]).end()
    await asyncio.to_thread(provider.shutdown)

    names = sorted(s.name for s in otlp_receiver.spans)
    assert names == sorted(["POST /v1/chat/completions", "chat up-m", "plain", "first", "linked"])


async def test_the_gateways_telemetry_encodes_its_spans_as_they_end(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)
    telemetry = start_telemetry(GatewayConfig.model_validate({"telemetry": {"enabled": True}}))
    assert telemetry is not None
    before = _live_records()
    for n in range(50):
        _request(telemetry.spans, n)
    assert _live_records() == before

    await asyncio.to_thread(telemetry.shutdown)
    assert len(otlp_receiver.spans) == 100
