"""The span processor: ended spans queued, exported in batches from one thread.

What the SDK's ``BatchSpanProcessor`` does, with the same ``OTEL_BSP_*`` settings and
defaults (schedule delay 5 s, batches of 512, a queue of 2,048: past it spans are dropped
and counted), for a fraction of the cost per span. The gateway's requests come whole, as
their notes (gateway.telemetry.request_trace), and their spans are made on the export thread
as their batch goes: by the exporter when it takes notes (the gateway's OTLP one, which
encodes a request at a time), here otherwise. Sizes and limits count the spans they make.

The SDK's ``on_end`` asks the operating system for the process id (a system call, for its
fork check), tests an Event and may set it, on every span; here a span (or a request) is one
``deque.append`` and two counts compared, and the export thread is woken once per full
batch (it exports full batches then, and whatever is queued when the delay passes, as the
SDK does). The gateway never forks after
starting its telemetry, so there is no fork check.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import TYPE_CHECKING, Any

from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from gateway.telemetry.otlp_http import stop_retrying
from gateway.telemetry.request_trace import RequestTrace
from gateway.telemetry.trace_replay import replay_logged

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import ReadableSpan, Span
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["SpanBatcher", "spans_of"]

logger = logging.getLogger(__name__)


class SpanBatcher(SpanProcessor):
    """Owns the queue of ended spans and the thread that hands them to ``exporter`` in
    batches of at most ``max_export_batch_size``: when a batch is full, every
    ``schedule_delay_millis`` otherwise, and all of them at :meth:`force_flush` and
    :meth:`shutdown`. Settings left None come from ``OTEL_BSP_*`` as the SDK reads them."""

    def __init__(
        self,
        exporter: SpanExporter,
        max_queue_size: int | None = None,
        schedule_delay_millis: float | None = None,
        max_export_batch_size: int | None = None,
    ) -> None:
        defaults: Any = BatchSpanProcessor  # its environment readers and checks, untyped
        if max_queue_size is None:
            max_queue_size = int(defaults._default_max_queue_size())
        if schedule_delay_millis is None:
            schedule_delay_millis = float(defaults._default_schedule_delay_millis())
        if max_export_batch_size is None:
            max_export_batch_size = int(defaults._default_max_export_batch_size())
        defaults._validate_arguments(max_queue_size, schedule_delay_millis, max_export_batch_size)
        self._exporter = exporter
        self._export_notes: Callable[[list[Any]], Any] | None = getattr(
            exporter, "export_notes", None
        )
        """The exporter's taker of requests' notes as they are (it makes and encodes each
        request's spans in turn, so a batch never holds them all), if it has one."""
        self._max_queue = max_queue_size
        self._batch = max_export_batch_size
        self._delay = schedule_delay_millis / 1000
        self._queue: collections.deque[ReadableSpan | RequestTrace] = collections.deque()
        # Spans queued = added - taken; each count written by one thread only.
        self._added = self._taken = 0
        self.dropped = 0
        """Spans dropped because the queue was full."""
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="llmgw-spans", daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        """Queue ``span`` (a sampled one: the recorder sends no other)."""
        self._add(span, 1)

    def on_trace(self, trace: RequestTrace) -> None:
        """Queue a finished request's notes (a sampled one), its spans made when taken."""
        self._add(trace, trace.span_count)

    def _add(self, item: ReadableSpan | RequestTrace, spans: int) -> None:
        queued = self._added - self._taken
        if queued + spans > self._max_queue:
            if not self.dropped:
                logger.warning("span queue full (%d): dropping spans", self._max_queue)
            self.dropped += spans
            return
        self._queue.append(item)
        self._added += spans
        if queued < self._batch <= queued + spans:  # each full batch wakes the thread once
            self._wake.set()

    def _run(self) -> None:
        while not self._stopped:
            woken = self._wake.wait(self._delay)
            self._wake.clear()
            if self._stopped:
                break
            # Woken by a full batch: the full batches only (the rest waits for the next);
            # the delay passed: everything queued.
            self._export(self._batch if woken else 1)

    def _export(self, least: int = 1) -> None:
        """Export queued spans a batch at a time (oldest first) while at least ``least``
        are queued."""
        with self._export_lock:
            queue, size = self._queue, self._batch
            while queue and self._added - self._taken >= least:
                items, spans = self._take(size)
                token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))
                try:
                    if self._export_notes is not None and spans <= size:
                        self._export_notes(items)
                        continue
                    made = spans_of(items)
                    for start in range(0, len(made), size):
                        self._exporter.export(made[start : start + size])
                except Exception:  # an export must never end the thread: the next may succeed
                    logger.exception("span export failed")
                finally:
                    detach(token)

    def _take(self, size: int) -> tuple[list[Any], int]:
        """The oldest queued items (spans and requests' notes) and the spans they make: at
        most ``size``, unless the oldest request alone makes more (a request's spans are
        never split between two takes)."""
        queue, taken = self._queue, 0
        items: list[Any] = []
        while queue:
            item = queue[0]
            spans = item.span_count if type(item) is RequestTrace else 1
            if taken and taken + spans > size:
                break
            items.append(queue.popleft())
            taken += spans
        self._taken += taken
        return items, taken

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export every queued span now (blocking)."""
        if self._stopped:
            return False
        self._export()
        return True

    def shutdown(self) -> None:
        """Stop the thread, export what is queued, shut the exporter down (blocking)."""
        if self._stopped:
            return
        self._stopped = True
        self._wake.set()
        stop_retrying(self._exporter)  # a gone collector must not hold the stop
        self._thread.join()
        self._export()
        self._exporter.shutdown()


def spans_of(items: Sequence[Any]) -> list[ReadableSpan]:
    """The spans of ``items`` (spans, and requests' notes replayed), in order."""
    spans: list[Any] = []
    for item in items:
        if type(item) is RequestTrace:
            spans += replay_logged(item)
        else:
            spans.append(item)
    return spans  # RecordedSpans among them, read as ReadableSpans
