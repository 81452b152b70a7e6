"""A request's recorded spans (gateway.telemetry.recorded_span): the sampler's one decision,
trace continuation, parent links, and what reaches the exporter, decoded from the OTLP bytes
the gateway sends."""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any, ClassVar

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    ParentBasedTraceIdRatio,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    get_current_span,
    set_span_in_context,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.steering.resolver import Ordering, Resolution
from gateway.telemetry.otlp_wire import SpanEncoder
from gateway.telemetry.recorded_span import SpanRecorder, _StockSampler
from gateway.telemetry.trace_replay import replay
from schemas import RouteCandidate, RoutePlan, RouteRequest
from tests.unit.gateway.telemetry.echo_requests import (
    CANDIDATE,
    TARGET,
    chat_request,
    echo_telemetry,
)

if TYPE_CHECKING:
    from tests.fixtures.otlp import OtlpReceiver

_TRACE = "0af7651916cd43dd8448eb211c80319c"
_PARENT = "b7ad6b7169203331"


def _recorder(sampler: Sampler | None = None) -> tuple[SpanRecorder, InMemorySpanExporter]:
    provider = TracerProvider(resource=Resource.create({"service.name": "t"}), sampler=sampler)
    exported = InMemorySpanExporter()
    return SpanRecorder(
        provider, SimpleSpanProcessor(exported), InstrumentationScope("llmgw")
    ), exported


def _decoded(exported: InMemorySpanExporter) -> list[Any]:
    spans: Any = exported.get_finished_spans()
    request = ExportTraceServiceRequest.FromString(SpanEncoder().encode(spans))
    return [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def _remote(flags: str) -> Any:
    carrier = {"traceparent": f"00-{_TRACE}-{_PARENT}-{flags}", "tracestate": "v=1"}
    return TraceContextTextMapPropagator().extract(carrier)


def test_a_sampled_client_trace_is_continued_and_children_hang_off_the_root() -> None:
    recorder, exported = _recorder()
    root = recorder.root("POST /v1/x", SpanKind.SERVER, _remote("01"), {"a": "b", "none": None})
    child = root.child("chat m", SpanKind.CLIENT, {"n": 1})
    child.set_attribute("dropped", None)
    child.set_attributes({"ok": True, "gone": None})
    child.add_event("gen_ai.choice", {"index": 0, "finish_reason": None})
    child.set_status(Status(StatusCode.ERROR))
    child.end()
    child.end()  # a second end sends nothing more
    root.end()

    first, second = _decoded(exported)
    assert first.trace_id.hex() == second.trace_id.hex() == _TRACE
    assert first.parent_span_id == second.span_id
    assert second.parent_span_id.hex() == _PARENT
    assert second.trace_state == first.trace_state == "v=1"
    assert (first.kind, second.kind) == (3, 2)  # CLIENT, SERVER
    assert {a.key for a in first.attributes} == {"n", "ok"}
    assert {a.key for a in second.attributes} == {"a"}
    assert [(e.name, [a.key for a in e.attributes]) for e in first.events] == [
        ("gen_ai.choice", ["index"])
    ]
    assert first.status.code == StatusCode.ERROR.value
    assert second.flags == 0x300  # its parent was remote
    assert first.flags == 0x100
    assert first.end_time_unix_nano >= first.start_time_unix_nano > 0


def test_an_unsampled_client_trace_exports_nothing_yet_keeps_its_ids() -> None:
    recorder, exported = _recorder()  # the default: parent-based, always on
    root = recorder.root("POST /v1/x", SpanKind.SERVER, _remote("00"), {})
    child = root.child("chat m", SpanKind.CLIENT, {})
    child.end()
    root.end()

    assert format(child.context.trace_id, "032x") == _TRACE
    assert not child.context.trace_flags.sampled
    assert exported.get_finished_spans() == ()


def test_the_sampler_decides_once_for_a_new_trace() -> None:
    recorder, exported = _recorder(ParentBased(ALWAYS_OFF))
    root = recorder.root("POST /v1/x", SpanKind.SERVER, None, {})
    root.child("llmgw.routing", SpanKind.INTERNAL, {}).end()
    root.end()

    assert root.context.trace_id != 0
    assert root.parent is None
    assert exported.get_finished_spans() == ()


async def _traced_attempt(
    receiver: OtlpReceiver, ratio: float, traceparent: str | None
) -> tuple[Any, dict[str, str]]:
    """A request's trace under ``sampler_ratio: ratio`` and its first attempt's headers,
    after the telemetry's shutdown flushed every span to ``receiver``."""
    telemetry = echo_telemetry(sampler_ratio=ratio)
    headers = [(b"traceparent", traceparent.encode())] if traceparent else []
    trace = chat_request(telemetry, headers=headers)
    cand, target = CANDIDATE, TARGET
    trace.routing(RouteRequest(model="m"))
    trace.routed(RoutePlan(model="m", candidates=(cand,)), None)
    sent = trace.attempt(1, cand, target, "chat", False).trace_headers
    trace.finish(200, "")
    await asyncio.to_thread(telemetry.shutdown)  # blocking: the export answers on this loop
    assert sent is not None
    return trace, sent


async def test_an_unsampled_request_sends_its_server_spans_context_and_exports_nothing(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)

    trace, sent = await _traced_attempt(otlp_receiver, 0.0, None)

    assert not trace.sampled
    assert sent == {"traceparent": f"00-{trace.trace_id}-{trace.span_id:016x}-00"}
    assert otlp_receiver.spans == []


async def test_a_sampled_client_parent_outranks_the_ratio_and_every_span_is_exported(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)

    trace, sent = await _traced_attempt(otlp_receiver, 0.0, f"00-{_TRACE}-{_PARENT}-01")

    assert trace.sampled
    version, trace_id, span_id, flags = sent["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", _TRACE, "01")
    spans = {s.name: s for s in otlp_receiver.spans}
    assert set(spans) == {"POST /v1/chat/completions", "llmgw.routing", "chat m"}
    server = spans["POST /v1/chat/completions"]
    assert server.parent_id == _PARENT
    assert spans["llmgw.routing"].parent_id == spans["chat m"].parent_id == server.span_id
    assert spans["chat m"].span_id == span_id
    assert {s.trace_id for s in spans.values()} == {_TRACE}


_STOCK_SAMPLERS: dict[str, Sampler] = {
    "always_on": ALWAYS_ON,
    "always_off": ALWAYS_OFF,
    "traceidratio": TraceIdRatioBased(0.5),
    "parentbased_always_on": ParentBased(ALWAYS_ON),
    "parentbased_always_off": ParentBased(ALWAYS_OFF),
    "parentbased_traceidratio": ParentBasedTraceIdRatio(0.25),
    "parentbased_mixed": ParentBased(TraceIdRatioBased(0.75), ALWAYS_OFF, ALWAYS_ON, ALWAYS_OFF),
}


@pytest.mark.parametrize("name", sorted(_STOCK_SAMPLERS))
def test_a_stock_samplers_decision_is_its_should_sample(name: str) -> None:
    sampler = _STOCK_SAMPLERS[name]
    stock = _StockSampler.of(sampler)
    assert stock is not None
    local = SpanContext(int(_TRACE, 16), 1, is_remote=False, trace_flags=TraceFlags(1))
    parents: list[Any] = [
        None,
        _remote("01"),
        _remote("00"),
        set_span_in_context(NonRecordingSpan(local)),
        set_span_in_context(NonRecordingSpan(SpanContext(1, 1, False, TraceFlags(0)))),
    ]
    ids = [
        0,
        1,
        2**63 - 1,
        2**63,
        2**63 + 1,
        2**64 - 1,
        *(random.getrandbits(128) for _ in range(200)),
    ]
    for parent in parents:
        span_context = get_current_span(parent).get_span_context()
        for trace_id in ids:
            expected = sampler.should_sample(parent, trace_id, "n").decision.is_sampled()  # type: ignore[no-untyped-call]
            assert stock.sampled(trace_id, span_context if span_context.is_valid else None) == (
                expected
            ), (name, parent, trace_id)


def test_any_other_sampler_is_asked() -> None:
    class Custom(Sampler):
        def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
            return SamplingResult(Decision.RECORD_AND_SAMPLE, {"sampler.said": "yes"})

        def get_description(self) -> str:
            return "custom"

    assert _StockSampler.of(Custom()) is None
    assert _StockSampler.of(ParentBased(Custom())) is None
    recorder, exported = _recorder(ParentBased(Custom()))
    recorder.root("POST /v1/x", SpanKind.SERVER, None, {"a": "b"}).end()

    (span,) = _decoded(exported)
    assert {a.key for a in span.attributes} == {"a", "sampler.said"}


def _steered(chain: str | None, axis: str | None, rule: str) -> Resolution:
    ordering = Ordering(how="priority", scored=False, weights=None, candidates=())
    return Resolution("auto", "auto", chain, axis, ordering, ("m",), (), rule=rule)


async def test_routing_spans_of_one_decision_share_its_attribute_set(
    otlp_receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp_receiver.endpoint)
    telemetry = echo_telemetry()
    cand = CANDIDATE
    plan = RoutePlan(model="m", candidates=(cand,), reason="weighted")
    decisions: list[Resolution | None] = [
        None,
        None,
        _steered("c", None, "r1"),
        _steered(None, "x", ""),
    ]
    spans = []
    for n, res in enumerate(decisions):
        trace = chat_request(telemetry, f"r-{n}", route="/x")
        trace.routing(RouteRequest(model="m"))
        trace.routed(plan, res)
        trace.finish(200, "")
        (span,) = [s for s in replay(trace) if s.name == "llmgw.routing"]
        spans.append(span)

    assert spans[0] is not None and spans[1] is not None
    assert spans[0].shape is not None and spans[0].shape is spans[1].shape  # one set, shared
    decided = {
        "llmgw.routing.subject_kind": "model.route",
        "llmgw.model": "m",
        "llmgw.routing.strategy": "weighted",
        "llmgw.routing.candidates": 1,
        "llmgw.routing.primary": "m#0",
        "llmgw.routing.pinned": False,
    }
    assert [s.attributes if s is not None else None for s in spans] == [
        decided,
        decided,
        {
            **decided,
            "llmgw.routing.target": "auto",
            "llmgw.routing.chain": "c",
            "llmgw.routing.rule": "r1",
        },
        {**decided, "llmgw.routing.target": "auto", "llmgw.routing.axis": "x"},
    ]
    await asyncio.to_thread(telemetry.shutdown)  # blocking: the export answers on this loop
    exported = [s.attributes for s in otlp_receiver.spans if s.name == "llmgw.routing"]
    assert exported == [s.attributes for s in spans if s is not None]


async def test_a_request_under_another_sampler_asks_it_once_with_the_server_spans_attributes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Custom(Sampler):
        seen: ClassVar[list[dict[str, Any]]] = []

        def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
            Custom.seen.append(dict(kwargs.get("attributes") or args[4]))
            return SamplingResult(Decision.RECORD_AND_SAMPLE, {"sampler.said": "yes"})

        def get_description(self) -> str:
            return "custom"

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # never reached
    telemetry = echo_telemetry()
    recorder, exported = _recorder(Custom())
    telemetry.spans = recorder  # the request's spans go to the in-memory exporter
    trace = chat_request(telemetry)
    assert trace.eager_server is not None  # asked at once, with the SERVER span's attributes
    (asked,) = Custom.seen
    assert asked["http.route"] == "/v1/chat/completions"
    assert asked["llmgw.request_id"] == "r-1"
    cand = RouteCandidate(
        endpoint="m#0", kind="echo", base_url="http://e:81/v1", upstream_model="m"
    )
    trace.routing(RouteRequest(model="m"))
    trace.routed(RoutePlan(model="m", candidates=(cand,)), None)
    trace.finish(200, "")
    await asyncio.to_thread(telemetry.shutdown)

    spans = {s.name: s for s in _decoded(exported)}
    assert set(spans) == {"POST /v1/chat/completions", "llmgw.routing"}
    server = spans["POST /v1/chat/completions"]
    assert {a.key: a.value.string_value for a in server.attributes}["sampler.said"] == "yes"
    assert spans["llmgw.routing"].parent_span_id == server.span_id
    assert len(Custom.seen) == 1  # the children follow the request's one decision
