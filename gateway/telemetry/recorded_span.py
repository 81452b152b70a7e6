"""The request's spans as plain records, made without the SDK tracer's per-span machinery.

The SDK's ``Tracer.start_span`` costs about 15 µs a span before any attribute (a context
lookup, a sampler call, a locked and validated attribute mapping, the processor chain); a
request makes four. Here the sampler decides once per request, for its SERVER span (every
built-in sampler gives the children the same answer: parent-based ones follow the parent,
the others depend on the trace id alone), ids come from the provider's id generator, and a
span is a slotted record whose attributes are a dict, handed at its end to the same
BatchSpanProcessor an SDK span would reach. It offers what the batch processor and the
exporter read of a ReadableSpan (gateway.telemetry.otlp_wire encodes it). Values are the
gateway's own (config ids, counts, bounded text): ``None`` values are dropped as the SDK
drops them; no other validation or span limit applies.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanContext, SpanKind, Status, TraceFlags, get_current_span

if TYPE_CHECKING:
    from collections.abc import Mapping

    from opentelemetry.context import Context
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

__all__ = ["RecordedEvent", "RecordedSpan", "SpanRecorder"]

_UNSET = Status()
_SAMPLED, _NOT_SAMPLED = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)


class SpanRecorder:
    """Makes a request's root span (the sampler's one decision) and takes every finished
    span to the batch processor; holds the provider's resource, sampler and id generator
    (owned by the Telemetry that made it)."""

    __slots__ = ("_ids", "_provider", "_sampler", "processor", "scope")

    def __init__(
        self, provider: TracerProvider, processor: SpanProcessor, scope: InstrumentationScope
    ) -> None:
        self._provider, self._sampler, self._ids = provider, provider.sampler, provider.id_generator
        self.processor, self.scope = processor, scope

    @property
    def resource(self) -> Resource:
        """The provider's resource (the SDK may extend it, e.g. after a fork)."""
        return self._provider.resource

    def new_span_id(self) -> int:
        return self._ids.generate_span_id()

    def root(
        self, name: str, kind: SpanKind, parent: Context | None, attributes: dict[str, Any]
    ) -> RecordedSpan:
        """A request's first span: a child of ``parent``'s span when that is a valid
        (remote) context, else the root of a new trace; sampled as the sampler says."""
        remote: SpanContext | None = get_current_span(parent).get_span_context()
        if remote is None or not remote.is_valid:
            remote = None
            trace_id = self._ids.generate_trace_id()
        else:
            trace_id = remote.trace_id
        decision = self._sampler.should_sample(parent, trace_id, name, kind, attributes)
        sampled = decision.decision.is_sampled()  # type: ignore[no-untyped-call]
        if sampled and decision.attributes:
            attributes = {**attributes, **decision.attributes}
        context = SpanContext(
            trace_id,
            self._ids.generate_span_id(),
            is_remote=False,
            trace_flags=_SAMPLED if sampled else _NOT_SAMPLED,
            trace_state=decision.trace_state,
        )
        return RecordedSpan(self, name, kind, context, remote, attributes)


class RecordedEvent:
    """A span event: name, time (ns since the epoch) and attributes."""

    __slots__ = ("attributes", "name", "timestamp")
    dropped_attributes = 0

    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self.name, self.attributes, self.timestamp = name, attributes, time.time_ns()


class RecordedSpan:
    """One span: started when made, sent to its sink's processor by :meth:`end` (once)
    when its context is sampled."""

    __slots__ = (
        "_recorder",
        "attributes",
        "context",
        "end_time",
        "events",
        "kind",
        "name",
        "parent",
        "start_time",
        "status",
    )
    links = ()
    dropped_attributes = dropped_events = dropped_links = 0

    def __init__(
        self,
        recorder: SpanRecorder,
        name: str,
        kind: SpanKind,
        context: SpanContext,
        parent: SpanContext | None,
        attributes: dict[str, Any],
    ) -> None:
        self._recorder = recorder
        self.name, self.kind, self.context, self.parent = name, kind, context, parent
        if None in attributes.values():
            attributes = {k: v for k, v in attributes.items() if v is not None}
        self.attributes = attributes
        self.events: list[RecordedEvent] = []
        self.status = _UNSET
        self.start_time = time.time_ns()
        self.end_time: int | None = None

    @property
    def resource(self) -> Resource:
        return self._recorder.resource

    @property
    def instrumentation_scope(self) -> InstrumentationScope:
        return self._recorder.scope

    def get_span_context(self) -> SpanContext:
        return self.context

    def child(self, name: str, kind: SpanKind, attributes: dict[str, Any]) -> RecordedSpan:
        """A span under this one (same trace, sampling and trace state; a fresh span id)."""
        ctx = self.context
        return RecordedSpan(
            self._recorder,
            name,
            kind,
            SpanContext(
                ctx.trace_id,
                self._recorder.new_span_id(),
                is_remote=False,
                trace_flags=ctx.trace_flags,
                trace_state=ctx.trace_state,
            ),
            ctx,
            attributes,
        )

    def set_attribute(self, key: str, value: Any) -> None:
        if value is not None:
            self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        for key, value in attributes.items():
            if value is not None:
                self.attributes[key] = value

    def set_status(self, status: Status) -> None:
        self.status = status

    def add_event(self, name: str, attributes: Mapping[str, Any]) -> None:
        kept = {k: v for k, v in attributes.items() if v is not None}
        self.events.append(RecordedEvent(name, kept))

    def end(self) -> None:
        if self.end_time is not None:
            return
        self.end_time = time.time_ns()
        if self.context.trace_flags.sampled:
            self._recorder.processor.on_end(self)  # type: ignore[arg-type]  # read as a ReadableSpan
