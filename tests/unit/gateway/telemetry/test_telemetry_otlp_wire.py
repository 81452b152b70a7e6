"""The span encoder (gateway.telemetry.otlp_wire): its bytes decode, with the official
``opentelemetry-proto`` messages, to exactly the request the SDK's own encoder builds."""

from __future__ import annotations

import random
import struct
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from gateway.telemetry.notes_wire import plain_spans
from gateway.telemetry.otlp_wire import SpanEncoder
from gateway.telemetry.recorded_span import SpanRecorder
from gateway.telemetry.trace_replay import replay
from schemas import Observation, RoutePlan, RouteRequest
from tests.unit.gateway.telemetry.echo_requests import (
    CANDIDATE,
    TARGET,
    chat_request,
    echo_telemetry,
)

if TYPE_CHECKING:
    from gateway.telemetry.provider import Telemetry
    from gateway.telemetry.request_trace import RequestTrace


def _recorder(provider: TracerProvider | None = None) -> SpanRecorder:
    """A recorder over a provider of its own, its spans kept nowhere (the tests encode them)."""
    provider = provider or TracerProvider(resource=Resource.create({"service.name": "llmgw"}))
    return SpanRecorder(
        provider, SimpleSpanProcessor(InMemorySpanExporter()), InstrumentationScope("llmgw")
    )


def _remote(state: TraceState | None = None) -> SpanContext:
    """A sampled remote parent (a client's traceparent), with ``state`` as its tracestate."""
    return SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C,
        span_id=0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
        trace_state=state,
    )


def _spans() -> list[ReadableSpan]:
    """Spans of two resources and three scopes, with every attribute type, events, error
    status, a remote parent with trace state, and local children."""
    finished = InMemorySpanExporter()
    spans_by_provider = []
    for service in ("llmgw", "other"):
        provider = TracerProvider(
            resource=Resource.create({"service.name": service, "deployment.id": 7}),
        )
        provider.add_span_processor(SimpleSpanProcessor(finished))
        spans_by_provider.append(provider)
    first, second = spans_by_provider
    remote = _remote(TraceState([("vendor", "opaque"), ("llmgw", "x1")]))
    tracer = first.get_tracer(
        "llmgw", "1.2.3", schema_url="https://opentelemetry.io/schemas/1.26.0"
    )
    server = tracer.start_span(
        "POST /v1/chat/completions",
        context=set_span_in_context(NonRecordingSpan(remote)),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": "POST", "server.port": 8080, "http.route": "/v1/x"},
    )
    child = tracer.start_span(
        "chat up-model",
        context=set_span_in_context(server),
        kind=SpanKind.CLIENT,
        attributes={
            "gen_ai.request.stream": False,
            "flag": True,
            "llmgw.cost_usd": 0.000125,
            "negative": -3,
            "large": 2**62,
            "empty": "",
            "zero": 0,
            "unicode": "モデル ✓",
            "gen_ai.response.finish_reasons": ["stop", "length"],
            "ints": [1, 2, 3],
            "bools": [True, False],
            "floats": [0.5],
        },
    )
    child.add_event("gen_ai.choice", {"index": 0, "content": '{"a": 1}'})
    child.add_event("bare")
    child.set_status(Status(StatusCode.ERROR, "upstream said no"))
    child.end()
    tracer.start_span("llmgw.routing", context=set_span_in_context(server)).end()
    server.set_status(Status(StatusCode.OK))
    server.end()
    first.get_tracer("second-scope").start_span("root", kind=SpanKind.INTERNAL).end()
    second.get_tracer("llmgw").start_span("elsewhere", kind=SpanKind.PRODUCER).end()
    return list(finished.get_finished_spans())


def test_encoded_request_decodes_to_the_sdk_encoders_message() -> None:
    spans = _spans()
    encoder = SpanEncoder()

    decoded = ExportTraceServiceRequest.FromString(encoder.encode(spans))

    assert decoded == encode_spans(spans)
    assert len(decoded.resource_spans) == 2
    assert [len(rs.scope_spans) for rs in decoded.resource_spans] == [2, 1]


def test_cached_pairs_encode_a_second_batch_identically() -> None:
    spans = _spans()
    encoder = SpanEncoder()
    first = encoder.encode(spans)

    assert encoder.encode(spans) == first
    assert ExportTraceServiceRequest.FromString(first) == encode_spans(spans)


def test_values_that_never_repeat_stop_being_cached_and_still_encode() -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "llmgw"}))
    finished = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(finished))
    tracer = provider.get_tracer("llmgw")
    for n in range(600):  # a unique request id each, and 1, 1.0, True under one key in turn
        tracer.start_span(
            "POST /v1/x",
            attributes={
                "llmgw.request_id": f"r-{n:016x}",
                "http.route": "/v1/x",
                "v": (1, 1.0, True)[n % 3],
            },
        ).end()
    spans = list(finished.get_finished_spans())
    encoder = SpanEncoder()

    decoded = ExportTraceServiceRequest.FromString(encoder.encode(spans))

    assert decoded == encode_spans(spans)
    keys = encoder._keys[b"\x4a"]
    assert keys["llmgw.request_id"].cached == 256  # the bound: later ids are encoded, not kept
    assert keys["v"].cached == 3  # 1, 1.0 and True: three pairs
    assert len(encoder._cached[b"\x4a"]) == 256 + 1 + 3  # the route too


def test_recorded_spans_encode_to_the_sdk_encoders_message() -> None:
    recorder = _recorder()
    remote = _remote(TraceState([("vendor", "opaque")]))
    server = recorder.root(
        "POST /v1/chat/completions",
        SpanKind.SERVER,
        set_span_in_context(NonRecordingSpan(remote)),
        {"http.route": "/v1/chat/completions", "server.port": 8080},
    )
    child = server.child("chat up", SpanKind.CLIENT, {"gen_ai.request.stream": True})
    child.set_attributes({"gen_ai.response.finish_reasons": ["stop"], "llmgw.cost_usd": 0.5})
    child.add_event("gen_ai.choice", {"index": 0, "content": "{}"})
    child.set_status(Status(StatusCode.ERROR, "upstream said no"))
    child.end()
    alone = recorder.root("GET /v1/models", SpanKind.SERVER, None, {})
    alone.end()
    server.end()
    spans: Any = [child, alone, server]

    decoded = ExportTraceServiceRequest.FromString(SpanEncoder().encode(spans))

    assert decoded == encode_spans(spans)


def test_spans_of_one_shape_encode_as_the_sdk_even_when_a_shaped_value_changes() -> None:
    recorder = _recorder()
    server = recorder.root("POST /v1/x", SpanKind.SERVER, None, {})
    shape = {"gen_ai.request.model": "up", "llmgw.attempt": 1, "gen_ai.request.stream": False}
    kept = server.child("chat up", SpanKind.CLIENT, shape, shape)
    kept.set_attributes({"gen_ai.usage.input_tokens": 3, "llmgw.outcome": "success"})
    changed = server.child("chat up", SpanKind.CLIENT, shape, shape)
    changed.set_attribute("llmgw.outcome", "failure")
    changed.set_attribute("gen_ai.request.model", "other")  # a shaped key: encoded anew
    both = server.child("chat up", SpanKind.CLIENT, shape, shape)
    both.set_attributes({"llmgw.attempt": 2, "error.type": "x"})
    for span in (kept, changed, both, server):
        span.end()
    spans: Any = [kept, changed, both, server]
    encoder = SpanEncoder()

    decoded = ExportTraceServiceRequest.FromString(encoder.encode(spans))

    assert decoded == encode_spans(spans)
    assert kept.shape is shape and changed.shape is None and both.shape is None
    assert shape == {
        "gen_ai.request.model": "up",
        "llmgw.attempt": 1,
        "gen_ai.request.stream": False,
    }
    assert ExportTraceServiceRequest.FromString(encoder.encode(spans)) == decoded  # cached


class _Tagging(Sampler):
    """Samples everything and sets one attribute (a sampler's right)."""

    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        return SamplingResult(Decision.RECORD_AND_SAMPLE, {"http.route": "/sampled"})

    def get_description(self) -> str:
        return "tagging"


def test_a_samplers_attribute_over_a_shaped_one_is_encoded() -> None:
    recorder = _recorder(TracerProvider(resource=Resource.create({}), sampler=_Tagging()))
    shape = {"http.route": "/v1/x", "url.scheme": "http"}
    server = recorder.root("POST /v1/x", SpanKind.SERVER, None, {**shape, "id": "r-1"}, shape)
    server.end()
    spans: Any = [server]

    decoded = ExportTraceServiceRequest.FromString(SpanEncoder().encode(spans))

    assert server.shape is None
    assert decoded == encode_spans(spans)


def test_a_negative_zero_is_not_given_a_cached_zeros_bytes() -> None:
    provider = TracerProvider(resource=Resource.create({}))
    finished = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(finished))
    tracer = provider.get_tracer("llmgw")
    for value in (0.0, -0.0):  # equal as floats (and as protobuf compares them), not as bytes
        tracer.start_span("s", attributes={"llmgw.cost_usd": value}).end()
    encoder = SpanEncoder()
    first, second = (encoder.encode([span]) for span in finished.get_finished_spans())

    assert struct.pack("<d", 0.0) in first
    assert struct.pack("<d", -0.0) in second


def test_shaped_roots_under_a_remote_parent_and_none_encode_as_the_sdk() -> None:
    recorder = _recorder()
    remote = _remote()
    shape = {"http.request.method": "POST", "http.route": "/v1/x"}
    spans: Any = []
    for parent in (set_span_in_context(NonRecordingSpan(remote)), None, None):
        span = recorder.root("POST /v1/x", SpanKind.SERVER, parent, dict(shape), shape, clean=True)
        span.attributes["http.response.status_code"] = 200
        span.end()
        spans.append(span)
    spans[2].set_status(Status(StatusCode.ERROR))  # not the shape's unset status
    encoder = SpanEncoder()

    for _ in range(2):  # the blocks made, then the blocks reused
        decoded = ExportTraceServiceRequest.FromString(encoder.encode(spans))
        assert decoded == encode_spans(spans)


def _requests_notes(monkeypatch: pytest.MonkeyPatch) -> tuple[Telemetry, list[RequestTrace]]:
    """Three finished requests' notes: a plain one, one admitted that failed over from a
    503 to a hedged pair, and one whose routing was abandoned (its client gone)."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # never reached
    telemetry = echo_telemetry()
    telemetry.spans.take_notes = lambda trace: None  # kept here, not handed to the batcher
    plan = RoutePlan(model="m", candidates=(CANDIDATE, CANDIDATE), reason="affinity")
    answer = {"id": "c-1", "model": "m", "choices": [{"finish_reason": "stop"}]}
    ok = Observation(endpoint="m#0", model="m", outcome="success", status=200, attempt=1)

    plain = chat_request(telemetry, "r-plain")
    plain.routing(RouteRequest(model="m"))
    plain.routed(plan, None)
    plain.attempt(1, CANDIDATE, TARGET, "chat", False)
    plain.answered(1, answer)
    plain.attempt_done(ok)
    plain.finish(200, "")

    hops = chat_request(telemetry, "r-hops")
    hops.admission_started()
    hops.admitted()
    hops.routing(RouteRequest(model="m"))
    hops.routed(plan, None)
    hops.attempt(1, CANDIDATE, TARGET, "chat", False)
    failed = Observation(
        endpoint="m#0", model="m", outcome="failure", status=503, error_kind="upstream_5xx"
    )
    hops.attempt_done(failed)
    hops.hedged(2, 3)
    hops.attempt(2, CANDIDATE, TARGET, "chat", True)
    hops.attempt(3, CANDIDATE, TARGET, "chat", True)
    hops.answered(2, {"id": "c-2", "choices": [{"finish_reason": "stop"}, {"x": 1}]})
    hops.finished(2, "length")
    declined = Observation(
        endpoint="m#0", model="m", outcome="cancelled", error_kind="hedge_declined", attempt=3
    )
    hops.attempt_done(declined)
    hops.attempt_done(Observation(endpoint="m#0", model="m", outcome="success", attempt=2))
    hops.finish(200, "")

    gone = chat_request(telemetry, "r-gone")
    gone.routing(RouteRequest(model="m"))
    gone.finish(499, "client_closed")
    return telemetry, [plain, hops, gone]


def test_requests_notes_encode_as_the_spans_they_make(monkeypatch: pytest.MonkeyPatch) -> None:
    telemetry, traces = _requests_notes(monkeypatch)
    random.seed(7)  # the routing and admission spans' ids are drawn as the notes are replayed
    spans = [span for trace in traces for span in replay(trace)]
    random.seed(7)
    from_notes = SpanEncoder().encode(traces)
    telemetry.shutdown()

    assert from_notes == SpanEncoder().encode(spans)
    decoded = ExportTraceServiceRequest.FromString(from_notes)
    assert decoded == encode_spans(spans)  # type: ignore[arg-type]  # read as ReadableSpans
    names = [s.name for s in decoded.resource_spans[0].scope_spans[0].spans]
    assert names == [
        *("llmgw.routing", "chat m", "POST /v1/chat/completions"),
        *("llmgw.admission", "llmgw.routing", "chat m", "chat m", "chat m"),
        "POST /v1/chat/completions",
        *("llmgw.routing", "POST /v1/chat/completions"),
    ]


def _plain_requests(telemetry: Telemetry) -> list[RequestTrace]:
    """Plain requests (routed once, served by the first attempt) in every variation the
    notes' direct encoding handles: a client's traceparent with a tracestate or none,
    answers with and without id, model or reasons, several reasons, cache tokens, a TTFT, a
    status unknown, the same candidate at another hop number, and streams with and without
    a finish reason noted as they relay."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    variations: list[tuple[list[tuple[bytes, bytes]], dict[str, Any], dict[str, Any]]] = [
        ([], {"id": "c-1", "model": "m", "choices": [{"finish_reason": "stop"}]}, {}),
        ([(b"traceparent", traceparent.encode())], {"choices": []}, {"status": None}),
        (
            [(b"traceparent", traceparent.encode()), (b"tracestate", b"v=1,w=2")],
            {"id": "", "model": 7, "choices": [{"finish_reason": "stop"}, {"finish_reason": 3}]},
            {"cached_tokens": 40, "cache_write_tokens": 8, "ttft_ms": 12.5},
        ),
        ([], {"id": "c-4", "choices": [{"finish_reason": "length"}]}, {"cost_usd": 0.25}),
    ]
    streams: list[str | None] = [None] * len(variations)
    # Streams: the first chunk without a reason then one, the first chunk's reason replaced
    # by the last's, a stream that never said why it stopped.
    first_chunk = {"id": "s-1", "model": "m", "choices": [{"delta": {"content": "Hi"}}]}
    variations += [([], first_chunk, {"ttft_ms": 3.0})] * 2
    variations.append(([], {"id": "s-3", "choices": [{"finish_reason": "stop"}]}, {}))
    variations.append(([], first_chunk, {}))
    streams += ["stop", "length", "length", ""]
    traces = []
    for n, (variation, stream) in enumerate(zip(variations, streams, strict=True)):
        headers, answer, observed = variation
        trace = chat_request(telemetry, f"r-{n}", headers=headers)
        trace.routing(RouteRequest(model="m"))
        trace.routed(RoutePlan(model="m", candidates=(CANDIDATE,), pinned=n == 2), None)
        number = 1 + n % 2
        trace.attempt(number, CANDIDATE, TARGET, "chat", stream is not None)
        trace.answered(number, answer)
        if stream:
            trace.finished(number, stream)
        fields: dict[str, Any] = {"status": 200, **observed}
        obs = Observation(endpoint="m#0", model="m", outcome="success", attempt=number, **fields)
        trace.attempt_done(obs)
        trace.finish(200 + n, "")
        traces.append(trace)
    return traces


@pytest.mark.parametrize("opt_in", ["", "http/dup"])
def test_plain_requests_are_encoded_from_their_notes_as_their_replayed_spans(
    monkeypatch: pytest.MonkeyPatch, opt_in: str
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # never reached
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", opt_in)
    telemetry = echo_telemetry()
    telemetry.spans.take_notes = lambda trace: None  # kept here, not handed to the batcher
    traces = _plain_requests(telemetry)
    encoder = SpanEncoder()
    random.seed(3)  # the routing spans' ids are drawn as the notes are encoded or replayed
    direct = [plain_spans(encoder, trace) for trace in traces]
    random.seed(3)
    spans = [span for trace in traces for span in replay(trace)]
    telemetry.shutdown()

    assert all(fields is not None for fields in direct)  # each taken the direct way
    replayed = SpanEncoder()
    assert [f for fields in direct for f in fields or ()] == [replayed._recorded(s) for s in spans]
    random.seed(3)
    decoded = ExportTraceServiceRequest.FromString(SpanEncoder().encode(traces))
    assert decoded == encode_spans(spans)  # type: ignore[arg-type]  # read as ReadableSpans


def test_requests_that_are_not_plain_are_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    telemetry, traces = _requests_notes(monkeypatch)
    telemetry.shutdown()

    assert [plain_spans(SpanEncoder(), trace) is None for trace in traces] == [False, True, True]
