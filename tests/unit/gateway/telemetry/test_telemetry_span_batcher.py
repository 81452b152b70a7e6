"""The span processor (gateway.telemetry.span_batcher): a full batch wakes the export thread
and only full batches go then; the schedule delay sends the rest; a full queue drops and
counts; flush and shutdown send everything; a request's notes count as the spans they make,
made on the export thread."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from gateway.telemetry.recorded_span import RecordedSpan
from gateway.telemetry.span_batcher import SpanBatcher
from schemas import Observation, RoutePlan, RouteRequest
from tests.unit.gateway.telemetry.echo_requests import (
    CANDIDATE,
    TARGET,
    chat_request,
    echo_telemetry,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.telemetry.request_trace import RequestTrace


class _Exporter(SpanExporter):
    """Keeps each batch; ``arrived`` is set at each export."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.arrived = threading.Event()
        self.shut = False

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.batches.append(list(spans))
        self.arrived.set()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut = True


_HOUR_MS = 3_600_000  # a delay that never passes in a test


def _held(exporter: SpanExporter, queue: int, batch: int) -> SpanBatcher:
    """A batcher whose schedule delay never passes: only full batches, flush and shutdown
    send."""
    return SpanBatcher(
        exporter, max_queue_size=queue, schedule_delay_millis=_HOUR_MS, max_export_batch_size=batch
    )


def test_a_full_batch_is_exported_at_once_and_the_rest_waits() -> None:
    exporter = _Exporter()
    batcher = _held(exporter, queue=100, batch=4)
    for n in range(3):
        batcher.on_end(n)  # type: ignore[arg-type]
    assert exporter.batches == []  # three: not a batch (and the delay is an hour)
    for n in range(3, 6):
        batcher.on_end(n)  # type: ignore[arg-type]
    assert exporter.arrived.wait(10)
    batcher.force_flush()
    batcher.shutdown()

    assert exporter.batches[0] == [0, 1, 2, 3]  # the full batch, oldest first
    assert [s for b in exporter.batches for s in b] == list(range(6))
    assert exporter.shut


def test_the_schedule_delay_sends_a_partial_batch() -> None:
    exporter = _Exporter()
    batcher = SpanBatcher(
        exporter, max_queue_size=1000, schedule_delay_millis=10, max_export_batch_size=512
    )
    batcher.on_end("a")  # type: ignore[arg-type]
    assert exporter.arrived.wait(10)
    batcher.shutdown()

    assert exporter.batches == [["a"]]


class _Held(_Exporter):
    """Holds its first export until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        result = super().export(spans)
        assert self.release.wait(10)
        return result


def test_a_full_queue_drops_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    exporter = _Held()
    batcher = _held(exporter, queue=3, batch=3)
    for n in range(3):
        batcher.on_end(n)  # type: ignore[arg-type]
    assert exporter.arrived.wait(10)  # the batch of three left the queue; its export holds
    for n in range(3, 8):
        batcher.on_end(n)  # type: ignore[arg-type]
    exporter.release.set()
    batcher.shutdown()

    assert batcher.dropped == 2
    assert [s for b in exporter.batches for s in b] == [0, 1, 2, 3, 4, 5]
    assert "span queue full" in caplog.text


def test_settings_come_from_the_sdks_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", str(_HOUR_MS))
    exporter = _Exporter()
    batcher = SpanBatcher(exporter)
    batcher.on_end("a")  # type: ignore[arg-type]
    batcher.on_end("b")  # type: ignore[arg-type]
    assert exporter.arrived.wait(10)
    batcher.shutdown()

    assert exporter.batches == [["a", "b"]]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_export_batch_size"):
        SpanBatcher(_Exporter(), max_queue_size=2, max_export_batch_size=3)


def _notes_of_requests(
    batcher: SpanBatcher, monkeypatch: pytest.MonkeyPatch, count: int
) -> list[RequestTrace]:
    """``count`` finished requests (SERVER, routing and one attempt span each), their notes
    handed to ``batcher`` as the gateway's telemetry hands them to its own."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # never reached
    telemetry = echo_telemetry()
    telemetry.spans.take_notes = batcher.on_trace
    cand = CANDIDATE
    traces = []
    for n in range(count):
        trace = chat_request(telemetry, f"r-{n}", route="/x")
        trace.routing(RouteRequest(model="m"))
        trace.routed(RoutePlan(model="m", candidates=(cand,)), None)
        trace.attempt(1, cand, TARGET, "chat", False)
        trace.attempt_done(Observation(endpoint="m#0", model="m", outcome="success"))
        # The hooks only noted: no span exists before the batcher takes the notes.
        assert trace.eager_server is None
        assert not [x for x in trace.notes if isinstance(x, RecordedSpan)]
        trace.finish(200, "")
        traces.append(trace)
    telemetry.shutdown()
    return traces


def test_a_requests_spans_count_toward_the_batch_and_are_made_on_the_export_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = _Threads()
    batcher = _held(exporter, queue=100, batch=5)
    traces = _notes_of_requests(batcher, monkeypatch, 1)
    assert exporter.batches == []  # three spans: not a batch
    traces += _notes_of_requests(batcher, monkeypatch, 1)  # six: a batch, woken at once
    assert exporter.arrived.wait(10)
    batcher.shutdown()

    # Never more than a batch at once, and a request's spans never split: the second
    # request's three would make the first batch six, so they wait (then the stop sends them).
    assert [len(b) for b in exporter.batches] == [3, 3]
    spans = [s for b in exporter.batches for s in b]
    assert [s.name for s in spans] == ["llmgw.routing", "chat m", "POST /x"] * 2
    assert [s.attributes["llmgw.request_id"] for s in spans[2::3]] == ["r-0", "r-0"]
    assert exporter.threads == ["llmgw-spans", "MainThread"]


def test_a_full_queue_drops_a_requests_spans_whole(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = _Exporter()
    batcher = _held(exporter, queue=5, batch=5)
    _notes_of_requests(batcher, monkeypatch, 2)  # 3 + 3 spans: the second does not fit
    batcher.shutdown()

    assert batcher.dropped == 3
    assert [s.name for b in exporter.batches for s in b] == ["llmgw.routing", "chat m", "POST /x"]
    assert "span queue full" in caplog.text


class _Threads(_Exporter):
    """Also notes the threads that export (and so made the spans of the batches)."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.threads.append(threading.current_thread().name)
        return super().export(spans)


class _NotesExporter(_Exporter):
    """An exporter that takes requests' notes as they are (as the gateway's OTLP one does)."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: list[list[Any]] = []

    def export_notes(self, items: Sequence[Any]) -> SpanExportResult:
        self.taken.append(list(items))
        self.arrived.set()
        return SpanExportResult.SUCCESS


def test_an_exporter_taking_notes_gets_whole_requests_never_more_than_a_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = _NotesExporter()
    batcher = _held(exporter, queue=100, batch=6)
    traces = _notes_of_requests(batcher, monkeypatch, 3)  # 3 spans each: two make a batch
    batcher.shutdown()

    assert exporter.taken == [traces[:2], traces[2:]]
    assert exporter.batches == []  # no span was made here: the exporter makes them


def test_a_request_making_more_than_a_batch_is_sent_as_spans_split_in_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = _NotesExporter()
    batcher = _held(exporter, queue=100, batch=2)
    _notes_of_requests(batcher, monkeypatch, 1)  # three spans, a batch is two
    batcher.shutdown()

    assert exporter.taken == []
    assert [[s.name for s in b] for b in exporter.batches] == [
        ["llmgw.routing", "chat m"],
        ["POST /x"],
    ]


def test_notes_that_cannot_be_replayed_lose_only_their_request(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    exporter = _Exporter()
    batcher = _held(exporter, queue=100, batch=10)
    broken = _notes_of_requests(batcher, monkeypatch, 2)[0]
    del broken.notes[-3:]  # its SERVER span's end: a step missing its values
    batcher.shutdown()

    assert [s.name for b in exporter.batches for s in b] == ["llmgw.routing", "chat m", "POST /x"]
    assert "spans of request r-0 not made" in caplog.text
