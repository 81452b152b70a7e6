"""The request's spans as plain records, made without the SDK tracer's per-span machinery.

The SDK's ``Tracer.start_span`` costs about 15 µs a span before any attribute (a context
lookup, a sampler call, a locked and validated attribute mapping, the processor chain); a
request makes four. Here the sampler decides once per request, for its SERVER span (every
built-in sampler gives the children the same answer: parent-based ones follow the parent,
the others depend on the trace id alone), ids come from the provider's id generator, and a
span is a slotted record whose attributes are a dict, handed at its end to the provider's
span processor (gateway.telemetry.span_batcher). It offers what a processor and the
exporter read of a ReadableSpan (gateway.telemetry.otlp_wire encodes it). Values are the
gateway's own (config ids, counts, bounded text): ``None`` values are dropped as the SDK
drops them; no other validation or span limit applies.

A span keeps its ids as plain ints (its ``SpanContext`` is made only when something asks for
it), and the sampler's decision is taken without a call when the sampler is one of the SDK's
stock ones (parent-based or not, always on or off, trace id ratio): the same decision,
attributes and trace state as its ``should_sample`` (a test compares them).
"""

from __future__ import annotations

import random
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ParentBased,
    Sampler,
    StaticSampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanContext, SpanKind, Status, TraceFlags, get_current_span

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from opentelemetry.context import Context
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import TraceState

__all__ = ["UNSET", "RecordedEvent", "RecordedSpan", "SpanRecorder"]

UNSET = Status()
"""The status of a span whose status was never set (one object, compared by identity)."""
_SAMPLED, _NOT_SAMPLED = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)
_now = time.time_ns
_new = object.__new__


_StaticDecision = bool | TraceIdRatioBased  # sampled or not, or the ratio that decides


def _static(sampler: Sampler) -> _StaticDecision | None:
    """The decision of a stock sampler that ignores its parent, else None."""
    if isinstance(sampler, StaticSampler) and type(sampler).should_sample is (
        StaticSampler.should_sample
    ):
        return bool(sampler._decision.is_sampled())  # type: ignore[no-untyped-call]
    if type(sampler).should_sample is TraceIdRatioBased.should_sample:
        return sampler  # type: ignore[return-value]  # a TraceIdRatioBased by its method
    return None


class _StockSampler:
    """A stock sampler's decision without the call: for ``ParentBased`` over stock delegates,
    the delegate the parent picks; for a stock sampler alone, its own."""

    __slots__ = ("_local", "_remote", "_root")

    def __init__(
        self,
        root: _StaticDecision,
        remote: tuple[_StaticDecision, _StaticDecision],
        local: tuple[_StaticDecision, _StaticDecision],
    ) -> None:
        self._root, self._remote, self._local = root, remote, local

    @classmethod
    def of(cls, sampler: Sampler) -> _StockSampler | None:
        """The stand-in for ``sampler``, or None when only its ``should_sample`` can say."""
        alone = _static(sampler)
        if alone is not None:
            return cls(alone, (alone, alone), (alone, alone))
        if not isinstance(sampler, ParentBased) or (
            type(sampler).should_sample is not ParentBased.should_sample
        ):
            return None
        found = [
            _static(s)
            for s in (
                sampler._root,
                sampler._remote_parent_sampled,
                sampler._remote_parent_not_sampled,
                sampler._local_parent_sampled,
                sampler._local_parent_not_sampled,
            )
        ]
        if any(d is None for d in found):
            return None
        root, remote_on, remote_off, local_on, local_off = found
        return cls(root, (remote_off, remote_on), (local_off, local_on))  # type: ignore[arg-type]

    def sampled(self, trace_id: int, parent: SpanContext | None) -> bool:
        if parent is None:
            decision = self._root
        else:
            decision = (self._remote if parent.is_remote else self._local)[
                parent.trace_flags.sampled
            ]
        if isinstance(decision, bool):
            return decision
        return trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < decision.bound


class SpanRecorder:
    """Makes a request's root span (the sampler's one decision) and takes every finished
    span to the batch processor; holds the provider's resource, sampler and id generator
    (owned by the Telemetry that made it)."""

    __slots__ = (
        "_ids",
        "_provider",
        "_sampler",
        "_span_id",
        "_stock",
        "_trace_id",
        "processor",
        "scope",
        "take_notes",
    )

    def __init__(
        self, provider: TracerProvider, processor: SpanProcessor, scope: InstrumentationScope
    ) -> None:
        self._provider, self._sampler, self._ids = provider, provider.sampler, provider.id_generator
        self._span_id = self._ids.generate_span_id
        self._trace_id = self._ids.generate_trace_id
        if type(self._ids) is RandomIdGenerator:  # its draws, without its Python frames
            self._span_id = partial(random.getrandbits, 64)
            self._trace_id = partial(random.getrandbits, 128)
        self._stock = _StockSampler.of(self._sampler)
        self.processor, self.scope = processor, scope
        self.take_notes: Callable[[Any], None] | None = getattr(processor, "on_trace", None)
        """The processor's taker of a finished request's notes (the span batcher's), if it
        has one (gateway.telemetry.request_trace)."""

    @property
    def resource(self) -> Resource:
        """The provider's resource (the SDK may extend it, e.g. after a fork)."""
        return self._provider.resource

    def new_span_id(self) -> int:
        """A fresh span id (never 0, the invalid one)."""
        return self._span_id() or self._ids.generate_span_id()

    def decide(
        self, parent: Context | None
    ) -> tuple[int, TraceState | None, SpanContext | None, bool] | None:
        """A new request's trace id, trace state, remote parent and whether it is sampled,
        when the sampler is a stock one (its decision needs no span name nor attributes);
        None otherwise (:meth:`root` asks the sampler)."""
        stock = self._stock
        if stock is None:
            return None
        remote: SpanContext | None = (
            None if parent is None else get_current_span(parent).get_span_context()
        )
        if remote is None or not remote.is_valid:
            trace_id = self._trace_id() or self._ids.generate_trace_id()  # never 0 (invalid)
            return trace_id, None, None, stock.sampled(trace_id, None)
        return remote.trace_id, remote.trace_state, remote, stock.sampled(remote.trace_id, remote)

    def root(
        self,
        name: str,
        kind: SpanKind,
        parent: Context | None,
        attributes: dict[str, Any],
        shape: dict[str, Any] | None = None,
        clean: bool = False,
    ) -> RecordedSpan:
        """A request's first span: a child of ``parent``'s span when that is a valid
        (remote) context, else the root of a new trace; sampled as the sampler says.
        ``shape``: a dict the caller never changes that ``attributes`` starts with;
        ``clean``: no value of ``attributes`` is None."""
        given = attributes
        remote: SpanContext | None = (
            None if parent is None else get_current_span(parent).get_span_context()
        )
        if remote is None or not remote.is_valid:
            remote = None
            trace_id = self._trace_id() or self._ids.generate_trace_id()  # never 0 (invalid)
            trace_state = None
        else:
            trace_id, trace_state = remote.trace_id, remote.trace_state
        stock = self._stock
        if stock is not None:
            sampled = stock.sampled(trace_id, remote)
        else:
            decision = self._sampler.should_sample(parent, trace_id, name, kind, attributes)
            sampled = decision.decision.is_sampled()  # type: ignore[no-untyped-call]
            if sampled and decision.attributes:
                attributes = {**attributes, **decision.attributes}
            trace_state = decision.trace_state
        clean = clean and attributes is given  # a sampler's attributes are not checked
        span = RecordedSpan(self, name, kind, trace_id, sampled, trace_state, attributes, clean)
        if shape is not None and span.attributes is given:  # no sampler's, no None, added
            span.shape = shape
        if remote is not None:
            span.parent_id, span.remote_parent = remote.span_id, remote
        return span


class RecordedEvent:
    """A span event: name, time (ns since the epoch) and attributes."""

    __slots__ = ("attributes", "name", "timestamp")
    dropped_attributes = 0

    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self.name, self.attributes, self.timestamp = name, attributes, time.time_ns()


class RecordedSpan:
    """One span: started when made, sent to its sink's processor by :meth:`end` (once)
    when sampled. Ids are ints (``parent_id`` 0: a root); ``context`` and ``parent`` are the
    SDK's ``SpanContext``s, made when asked."""

    __slots__ = (
        "attributes",
        "end_time",
        "events",
        "kind",
        "name",
        "parent_id",
        "recorder",
        "remote_parent",
        "sampled",
        "shape",
        "span_id",
        "start_time",
        "status",
        "trace_id",
        "trace_state",
    )
    links = ()
    dropped_attributes = dropped_events = dropped_links = 0

    def __init__(
        self,
        recorder: SpanRecorder,
        name: str,
        kind: SpanKind,
        trace_id: int,
        sampled: bool,
        trace_state: TraceState | None,
        attributes: dict[str, Any],
        clean: bool = False,
    ) -> None:
        """``clean``: no value of ``attributes`` is None (else those are dropped)."""
        self.recorder = recorder
        self.name, self.kind, self.trace_id, self.span_id = (
            name,
            kind,
            trace_id,
            recorder._span_id() or recorder._ids.generate_span_id(),  # never 0 (invalid)
        )
        self.sampled, self.trace_state = sampled, trace_state
        self.parent_id = 0
        self.remote_parent: SpanContext | None = None
        if not clean and None in attributes.values():  # a scan comparing every value
            attributes = {k: v for k, v in attributes.items() if v is not None}
        self.attributes = attributes
        self.shape: dict[str, Any] | None = None
        """Attributes this span began with, shared with other spans and never changed (its
        ``attributes`` start with them while this is set: the encoder reuses their bytes)."""
        self.events: tuple[()] | list[RecordedEvent] = ()
        self.status = UNSET
        self.start_time = _now()
        self.end_time: int | None = None

    @classmethod
    def restored(
        cls,
        recorder: SpanRecorder,
        name: str,
        kind: SpanKind,
        trace_id: int,
        span_id: int,
        trace_state: TraceState | None,
        remote_parent: SpanContext | None,
        attributes: dict[str, Any],
        shape: dict[str, Any] | None,
        start_time: int,
    ) -> RecordedSpan:
        """A sampled span whose ids, parent and start were decided earlier (a request's
        SERVER span, made from its notes): ``attributes`` hold no None and start with
        ``shape``'s when it is given."""
        span: RecordedSpan = _new(RecordedSpan)
        span.recorder, span.name, span.kind = recorder, name, kind
        span.trace_id, span.span_id, span.sampled, span.trace_state = (
            trace_id,
            span_id,
            True,
            trace_state,
        )
        span.remote_parent = remote_parent
        span.parent_id = remote_parent.span_id if remote_parent is not None else 0
        span.attributes, span.shape = attributes, shape
        span.events, span.status, span.end_time = (), UNSET, None
        span.start_time = start_time
        return span

    @property
    def context(self) -> SpanContext:
        return SpanContext(
            self.trace_id,
            self.span_id,
            is_remote=False,
            trace_flags=_SAMPLED if self.sampled else _NOT_SAMPLED,
            trace_state=self.trace_state,
        )

    @property
    def parent(self) -> SpanContext | None:
        if self.remote_parent is not None:
            return self.remote_parent
        if not self.parent_id:
            return None
        return SpanContext(
            self.trace_id,
            self.parent_id,
            is_remote=False,
            trace_flags=_SAMPLED if self.sampled else _NOT_SAMPLED,
            trace_state=self.trace_state,
        )

    @property
    def resource(self) -> Resource:
        return self.recorder.resource

    @property
    def instrumentation_scope(self) -> InstrumentationScope:
        return self.recorder.scope

    def get_span_context(self) -> SpanContext:
        return self.context

    def child(
        self,
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any],
        shape: dict[str, Any] | None = None,
        span_id: int = 0,
    ) -> RecordedSpan:
        """A span under this one (same trace, sampling and trace state; ``span_id``, or a
        fresh one), with ``attributes`` (holding no None), or a copy of ``shape`` (a dict the
        caller never changes, holding no None)."""
        # What __init__ does, without calling the class: a Python __init__ reached through
        # type.__call__ costs more than the stores themselves.
        span: RecordedSpan = _new(RecordedSpan)
        recorder = span.recorder = self.recorder
        span.name, span.kind, span.trace_id = name, kind, self.trace_id
        span.span_id = span_id or recorder._span_id() or recorder._ids.generate_span_id()
        span.sampled, span.trace_state = self.sampled, self.trace_state
        span.parent_id, span.remote_parent = self.span_id, None
        if shape is None:
            span.attributes, span.shape = attributes, None
        else:
            span.attributes, span.shape = dict(shape), shape
        span.events, span.status, span.end_time = (), UNSET, None
        span.start_time = _now()
        return span

    def reshape(self, shape: dict[str, Any]) -> None:
        """Take a copy of ``shape`` (a dict the caller never changes, holding no None) as the
        span's attributes, in place of those it has."""
        self.attributes, self.shape = dict(shape), shape

    def set_attribute(self, key: str, value: Any) -> None:
        if value is not None:
            if self.shape is not None and key in self.shape:
                self.shape = None  # a shaped value changed: the encoder reads them all
            self.attributes[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self.shape is not None and not self.shape.keys().isdisjoint(attributes):
            self.shape = None
        if None not in attributes.values():
            self.attributes.update(attributes)
            return
        for key, value in attributes.items():
            if value is not None:
                self.attributes[key] = value

    def extend(self, attributes: dict[str, Any]) -> None:
        """Add ``attributes``, none of them None nor a key of the span's shape (the caller
        knows: :meth:`set_attributes` checks both, a scan of every value)."""
        self.attributes.update(attributes)

    def set_status(self, status: Status) -> None:
        self.status = status

    def add_event(self, name: str, attributes: Mapping[str, Any]) -> None:
        kept = {k: v for k, v in attributes.items() if v is not None}
        events = self.events
        if not isinstance(events, list):  # a span without events shares the empty tuple
            events = self.events = []
        events.append(RecordedEvent(name, kept))

    def end(self) -> None:
        if self.end_time is not None:
            return
        self.end_time = _now()
        if self.sampled:
            self.recorder.processor.on_end(self)  # type: ignore[arg-type]  # read as a ReadableSpan
