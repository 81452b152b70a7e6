"""OTLP/protobuf bytes of finished SDK spans, built straight on the wire format.

The SDK's encoder builds a protobuf object per span, attribute and value (about 45 µs a span
here, on the exporter thread but on the gateway's CPU). A gateway's spans repeat the same
attribute pairs (method, route, model, endpoint, provider) request after request, so each
``key=value`` pair is encoded once and its bytes reused, looked up by (key, value, type of
value) in one dict (``1``, ``1.0`` and ``True`` are three values); a key
whose values do not repeat (a request id) stops being cached once it has a few hundred, so
unique values neither fill the cache nor evict the repeating ones. The resource and scope
are encoded once, and a batch's gateway spans are grouped by their recorder, not by
comparing scopes span by span.
The bytes decode to the message ``encode_spans`` builds (a test compares them).
Raises TypeError for an attribute value OTLP has no type for (the SDK never stores one).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode

from gateway.telemetry.notes_wire import plain_spans
from gateway.telemetry.otlp_http import transport_for
from gateway.telemetry.recorded_span import UNSET, RecordedEvent, RecordedSpan, SpanRecorder
from gateway.telemetry.request_trace import RequestTrace
from gateway.telemetry.span_batcher import spans_of
from gateway.telemetry.trace_replay import replay_logged

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Status, TraceState

logger = logging.getLogger(__name__)

__all__ = ["SpanEncoder", "WireSpanExporter"]

_MAX_CACHED = 8192  # span names
_MAX_KEYS = 1024  # attribute keys with cached values (the gateway's own: a few dozen)
_MAX_VALUES = 256  # cached values per key and kind of value; more are encoded each time
_pack_u64 = struct.Struct("<Q").pack
_pack_double = struct.Struct("<d").pack
# SpanFlags: the context's remoteness is known (0x100), and the parent was remote (0x200).
_FLAGS_LOCAL = b"\x85\x01" + struct.pack("<I", 0x100)
_FLAGS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x300)
# Keyed by the members' ids: an Enum member hashes in Python code (its name's hash), an int in C.
_KINDS = {id(kind): b"\x30" + bytes((kind.value + 1,)) for kind in SpanKind}  # the proto's from 1
_STATUS_CODES = {
    id(code): b"\x18" + bytes((code.value,)) if code.value else b"" for code in StatusCode
}
_STATUSES = {code: b"\x7a" + bytes((len(body),)) + body for code, body in _STATUS_CODES.items()}
_UNSET_STATUS = _STATUSES[id(StatusCode.UNSET)]
_UNSET_LOCAL, _UNSET_REMOTE = _UNSET_STATUS + _FLAGS_LOCAL, _UNSET_STATUS + _FLAGS_REMOTE
_KIND_VALUES = {id(kind): kind.value + 1 for kind in SpanKind}
_KIND_TIMES = struct.Struct("<BBBQBQ").pack  # kind, then start and end (fixed64 fields 7, 8)
_IDS = struct.Struct(">HQQHQ").pack  # trace id (two halves) and span id, with their keys
_IDS_PARENT = struct.Struct(">HQQHQHQ").pack  # the same, then the parent span id (field 4)
_LOW = _U64 = (1 << 64) - 1


_ONE_BYTE = [bytes((n,)) for n in range(0x80)]


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field (``tag`` is the field's key byte(s))."""
    n = len(payload)
    if n < 0x80:
        return tag + _ONE_BYTE[n] + payload
    if n < 0x4000:  # a span's body: two length bytes
        return tag + bytes(((n & 0x7F) | 0x80, n >> 7)) + payload
    return tag + _varint(n) + payload


def _any_value(value: Any) -> bytes:
    """An AnyValue message's bytes."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", value.encode())
    if isinstance(value, int):
        return b"\x18" + _varint(value & 0xFFFFFFFFFFFFFFFF)  # int64: two's complement
    if isinstance(value, float):
        return b"\x21" + _pack_double(value)
    if isinstance(value, bytes):
        return _field(b"\x3a", value)
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", _any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return _field(
            b"\x32", b"".join(_field(b"\x0a", _key_value(str(k), v)) for k, v in value.items())
        )
    raise TypeError(f"no OTLP type for an attribute value of type {type(value).__name__}")


def _key_value(key: str, value: Any) -> bytes:
    return _field(b"\x0a", key.encode()) + _field(b"\x12", _any_value(value))


class _Key:
    """One attribute key's encoding (as repeated field ``tag``) and how many of its pairs
    the encoder's cache holds (at most ``_MAX_VALUES``)."""

    __slots__ = ("cached", "head", "tag")

    def __init__(self, tag: bytes, key: str) -> None:
        self.tag = tag
        self.head = _field(b"\x0a", key.encode())  # the KeyValue's key field
        self.cached = 0

    def pair(self, value: Any) -> bytes:
        """The KeyValue field of ``value``."""
        return _field(self.tag, self.head + _field(b"\x12", _any_value(value)))


def _cacheable(cls: type, value: Any) -> bool:
    """Whether a pair may be found again by (key, value, type): scalars, and sequences of
    strings only (a tuple ``(1,)`` equals ``(True,)``); never a float zero (-0.0 equals 0.0)."""
    if cls is str or cls is int or cls is bool:
        return True
    if cls is float:
        return bool(value)
    if cls is tuple:
        return all(type(v) is str for v in value)
    return False


class SpanEncoder:
    """Encodes export requests; owns the caches of encoded attribute pairs, resources and
    scopes (used from the span processor's export thread)."""

    def __init__(self) -> None:
        self._keys: dict[bytes, dict[str, _Key]] = {}
        # Encoded pairs by (key, value, type of value), per tag: one lookup a pair.
        self._cached: dict[bytes, dict[tuple[str, Any, type], bytes]] = {}
        self._span_pairs = self._cached[b"\x4a"] = {}  # a span's attributes: looked up most
        self._resources: dict[int, tuple[Resource, bytes]] = {}
        self._scopes: dict[InstrumentationScope | None, bytes] = {}
        self._names: dict[str, bytes] = {}
        self._shapes: dict[int, tuple[dict[str, Any], bytes]] = {}
        self._local: dict[int, tuple[dict[str, Any], str, bytes]] = {}  # blocks of shapes
        self._remote: dict[int, tuple[dict[str, Any], str, bytes]] = {}  # the same, remote parent

    def _attributes(self, tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
        """Each attribute as a repeated KeyValue field ``tag``; pairs cached by key."""
        if not attributes:
            return b""
        return self._pairs(tag, attributes)

    def _shaped(self, span: RecordedSpan, shape: dict[str, Any]) -> bytes:
        """A span's attributes when they start with ``shape``'s (encoded once per shape,
        held so its id is not reused)."""
        found = self._shapes.get(id(shape))
        if found is None or found[0] is not shape:
            if len(self._shapes) >= _MAX_CACHED:
                self._shapes.clear()
            found = self._shapes[id(shape)] = (shape, self._attributes(b"\x4a", shape))
        attributes, n = span.attributes, len(shape)
        if len(attributes) == n:  # nothing added
            return found[1]
        return found[1] + self._pairs(b"\x4a", attributes, n)

    def _pairs(self, tag: bytes, attributes: Mapping[str, Any], start: int = 0) -> bytes:
        """``attributes``' pairs from the ``start``-th on, as repeated field ``tag``."""
        cached = self._cached.get(tag)
        if cached is None:
            cached = self._cached[tag] = {}
        items = attributes.items()
        get = cached.get
        parts = []
        try:
            for k, v in items if not start else islice(items, start, None):
                found = get((k, v, type(v)))
                parts.append(self._miss(tag, k, v) if found is None else found)
        except TypeError:  # an unhashable value (a list): no lookup for any
            pairs = islice(items, start, None)
            return b"".join([self._key(tag, k).pair(v) for k, v in pairs])
        return b"".join(parts)

    def _miss(self, tag: bytes, key: str, value: Any) -> bytes:
        """A pair not cached yet (cached now when it can be, while its key has room)."""
        k = self._key(tag, key)
        found = k.pair(value)
        cls = type(value)
        if k.cached < _MAX_VALUES and _cacheable(cls, value):
            self._cached[tag][key, value, cls] = found
            k.cached += 1
        return found

    def _key(self, tag: bytes, key: str) -> _Key:
        keys = self._keys.get(tag)
        if keys is None:
            keys = self._keys[tag] = {}
        k = keys.get(key)
        if k is None:
            k = _Key(tag, key)
            if len(keys) < _MAX_KEYS:
                keys[key] = k
            else:  # a key past the bound: its pairs are never cached
                k.cached = _MAX_VALUES
        return k

    def _resource(self, resource: Resource) -> bytes:
        """The ResourceSpans' resource field (a Resource hashes as JSON: cached by identity,
        holding the object so its id is not reused)."""
        found = self._resources.get(id(resource))
        if found is None or found[0] is not resource:
            found = (resource, _field(b"\x0a", self._attributes(b"\x0a", resource.attributes)))
            self._resources[id(resource)] = found
        return found[1]

    def _scope(self, scope: InstrumentationScope | None) -> tuple[bytes, bytes]:
        """The ScopeSpans' leading scope field and trailing schema URL field."""
        found = self._scopes.get(scope)
        if found is None:
            if scope is None:
                found = b"\x0a\x00"
            else:
                body = _field(b"\x0a", scope.name.encode())
                if scope.version:
                    body += _field(b"\x12", scope.version.encode())
                body += self._attributes(b"\x1a", scope.attributes)
                found = _field(b"\x0a", body)
            self._scopes[scope] = found
        schema = scope.schema_url if scope is not None else ""
        return found, _field(b"\x1a", schema.encode()) if schema else b""

    def _name(self, name: str) -> bytes:
        """The span's name field (names repeat: a route, an operation and model)."""
        found = self._names.get(name)
        if found is None:
            if len(self._names) >= _MAX_CACHED:
                self._names.clear()
            found = self._names[name] = _field(b"\x2a", name.encode())
        return found

    def _recorded(self, span: RecordedSpan) -> bytes:
        """The ScopeSpans' field of one gateway span (its ids as they are, no SpanContext
        made; what it never has, dropped counts and links, not looked at)."""
        ids = self.ids(span.trace_id, span.span_id, span.parent_id, span.trace_state)
        timing = _KIND_TIMES(
            0x30, _KIND_VALUES[id(span.kind)], 0x39, span.start_time, 0x41, span.end_time or 0
        )
        shape = span.shape
        if shape is not None and span.status is UNSET and not span.events:
            block = self.block(shape, span.name, span.remote_parent is not None)
            attributes, n = span.attributes, len(shape)
            added = list(islice(attributes.items(), n, None)) if len(attributes) > n else []
            return self.shaped(ids, timing, block, added)
        name = self._names.get(span.name)
        parts = [
            ids,
            self._name(span.name) if name is None else name,
            timing,
            self._attributes(b"\x4a", span.attributes)
            if shape is None
            else self._shaped(span, shape),
        ]
        if span.events:
            parts += [self._event(event) for event in span.events]
        status = span.status
        if status is UNSET:
            parts.append(_UNSET_LOCAL if span.remote_parent is None else _UNSET_REMOTE)
        else:
            parts.append(self._status(status))
            parts.append(_FLAGS_LOCAL if span.remote_parent is None else _FLAGS_REMOTE)
        return _field(b"\x12", b"".join(parts))

    @staticmethod
    def ids(trace_id: int, span_id: int, parent_id: int, trace_state: TraceState | None) -> bytes:
        """A span's trace id, span id, trace state and parent span id (0: none) fields."""
        if parent_id and not trace_state:  # a child: ids and parent id in one pack
            low = trace_id & _LOW
            return _IDS_PARENT(0x0A10, trace_id >> 64, low, 0x1208, span_id, 0x2208, parent_id)
        ids = _IDS(0x0A10, trace_id >> 64, trace_id & _LOW, 0x1208, span_id)
        if trace_state:
            state = ",".join(f"{k}={v}" for k, v in trace_state.items())
            ids += _field(b"\x1a", state.encode())
        if parent_id:
            ids += b"\x22\x08" + parent_id.to_bytes(8, "big")
        return ids

    @staticmethod
    def timing(kind: SpanKind, start: int, end: int) -> bytes:
        """A span's kind, start and end time fields."""
        return _KIND_TIMES(0x30, _KIND_VALUES[id(kind)], 0x39, start, 0x41, end)

    def shaped(
        self, ids: bytes, timing: bytes, block: bytes, added: list[tuple[str, Any]]
    ) -> bytes:
        """The ScopeSpans' field of a span of unset status and no events whose attributes
        are its shape's (``block``, see :meth:`block`) and then the pairs ``added``."""
        # Fields in any order are valid protobuf: what the span shares with every span of
        # its shape (name, the shape's attributes, status, flags) is one cached block.
        if not added:
            body = ids + timing + block
        else:  # each pair looked up once (as _pairs does)
            get, parts = self._span_pairs.get, [ids, timing, block]
            try:
                for k, v in added:
                    found = get((k, v, type(v)))
                    parts.append(self._miss(b"\x4a", k, v) if found is None else found)
            except TypeError:  # an unhashable value (a list): no lookup for any
                del parts[3:]
                parts += [self._key(b"\x4a", k).pair(v) for k, v in added]
            body = b"".join(parts)
        size = len(body)
        if size < 0x4000:  # a span's body: at most two length bytes
            if size < 0x80:
                return b"\x12" + _ONE_BYTE[size] + body
            return b"\x12" + bytes(((size & 0x7F) | 0x80, size >> 7)) + body
        return b"\x12" + _varint(size) + body

    def block(self, shape: dict[str, Any], name: str, remote: bool) -> bytes:
        """The name, ``shape``'s attributes, unset status and flags of a span of ``shape``
        (``remote``: its parent is remote), encoded once and cached (by shape and remoteness
        of the parent, held so the shape's id is not reused; a shape has one span name)."""
        blocks = self._remote if remote else self._local
        found = blocks.get(id(shape))
        if found is not None and found[0] is shape and found[1] == name:
            return found[2]
        if len(blocks) >= _MAX_CACHED:
            blocks.clear()
        tail = _UNSET_REMOTE if remote else _UNSET_LOCAL
        block = self._name(name) + self._attributes(b"\x4a", shape) + tail
        blocks[id(shape)] = (shape, name, block)
        return block

    def _event(self, event: Event | RecordedEvent) -> bytes:
        """A span's field of one event."""
        body = b"\x09" + _pack_u64(event.timestamp) + _field(b"\x12", event.name.encode())
        body += self._attributes(b"\x1a", event.attributes)
        if event.dropped_attributes:
            body += b"\x20" + _varint(event.dropped_attributes)
        return _field(b"\x5a", body)

    @staticmethod
    def _status(status: Status) -> bytes:
        if status.description:
            body = _field(b"\x12", status.description.encode())
            return _field(b"\x7a", body + _STATUS_CODES[id(status.status_code)])
        return _STATUSES[id(status.status_code)]

    def _span(self, span: ReadableSpan) -> bytes:
        """The ScopeSpans' field of one SDK span."""
        ctx = span.get_span_context()
        assert ctx is not None  # an SDK span always has its context
        trace_id, span_id, trace_state = ctx.trace_id, ctx.span_id, ctx.trace_state
        parent = span.parent
        parent_id = parent.span_id if parent is not None else None
        remote = parent is not None and parent.is_remote
        parts = [b"\x0a\x10", trace_id.to_bytes(16, "big"), b"\x12\x08"]
        parts.append(span_id.to_bytes(8, "big"))
        if trace_state:
            state = ",".join(f"{k}={v}" for k, v in trace_state.items())
            parts.append(_field(b"\x1a", state.encode()))
        if parent_id is not None:
            parts += (b"\x22\x08", parent_id.to_bytes(8, "big"))
        parts.append(self._name(span.name))
        parts.append(_KINDS[id(span.kind)])
        parts += (b"\x39", _pack_u64(span.start_time or 0), b"\x41", _pack_u64(span.end_time or 0))
        parts.append(self._attributes(b"\x4a", span.attributes))
        if span.dropped_attributes:
            parts += (b"\x50", _varint(span.dropped_attributes))
        parts += [self._event(event) for event in span.events]
        if span.dropped_events:
            parts += (b"\x60", _varint(span.dropped_events))
        parts.append(self._status(span.status))
        parts.append(_FLAGS_REMOTE if remote else _FLAGS_LOCAL)
        return _field(b"\x12", b"".join(parts))

    def encode(self, spans: Sequence[ReadableSpan | RecordedSpan | RequestTrace]) -> bytes:
        """An ExportTraceServiceRequest of ``spans`` (grouped by resource, then scope, in order
        of first appearance); a request's notes among them are its spans, each made and
        encoded in turn (only one request's span objects exist at a time). Raises ValueError
        for a span with links (this gateway makes none: the SDK's encoder serves those)."""
        grouped: dict[int, tuple[Resource, dict[InstrumentationScope | None, list[bytes]]]] = {}
        recorded: dict[int, list[bytes]] = {}  # a recorder's spans: its resource and scope
        recorded_of = self._recorded

        def of_recorder(recorder: SpanRecorder) -> list[bytes]:
            """The encoded spans of a gateway recorder's resource and scope."""
            encoded = recorded.get(id(recorder))
            if encoded is None:
                encoded = recorded[id(recorder)] = self._group(
                    grouped, recorder.resource, recorder.scope
                )
            return encoded

        for span in spans:
            if isinstance(span, RequestTrace):  # a request's spans, from its notes
                fields = plain_spans(self, span)
                if fields is None:
                    fields = [recorded_of(s) for s in replay_logged(span)]
                of_recorder(span.telemetry.spans).extend(fields)
                continue
            if isinstance(span, RecordedSpan):  # a final class
                of_recorder(span.recorder).append(recorded_of(span))
                continue
            if span.links:
                raise ValueError("span links are not encoded here")
            self._group(grouped, span.resource, span.instrumentation_scope).append(self._span(span))
        out = []
        for resource, by_scope in grouped.values():
            body = [self._resource(resource)]
            for scope, encoded in by_scope.items():
                head, tail = self._scope(scope)
                body.append(_field(b"\x12", head + b"".join(encoded) + tail))
            if resource.schema_url:
                body.append(_field(b"\x1a", resource.schema_url.encode()))
            out.append(_field(b"\x0a", b"".join(body)))
        return b"".join(out)

    @staticmethod
    def _group(
        grouped: dict[int, tuple[Resource, dict[InstrumentationScope | None, list[bytes]]]],
        resource: Resource,
        scope: InstrumentationScope | None,
    ) -> list[bytes]:
        """The list of encoded spans of ``resource`` and ``scope`` in ``grouped``."""
        by_scope = grouped.setdefault(id(resource), (resource, {}))[1]
        return by_scope.setdefault(scope or None, [])


class WireSpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP span exporter (endpoint, headers, compression, timeout and
    retries from the ``OTEL_EXPORTER_OTLP_*`` variables), encoding with :class:`SpanEncoder`
    and posting on one kept-alive connection (gateway.telemetry.otlp_http)."""

    def __init__(self) -> None:
        transport = transport_for("TRACES")
        if transport is None:
            super().__init__()
        else:
            super().__init__(_transport=transport)
        self._encoder = SpanEncoder()

    def export_notes(self, items: Sequence[ReadableSpan | RequestTrace]) -> SpanExportResult:
        """Send the spans of ``items`` (spans, and requests' notes made into their spans here,
        one request at a time) in one request; what is not encoded here (a span with links,
        no HTTP client of the SDK's) goes the SDK's own way."""
        client = getattr(self, "_client", None)  # the SDK's HTTP client, since 1.4x
        if self._shutdown or client is None or any(_linked(item) for item in items):
            return super().export(spans_of(items))
        try:
            data = self._encoder.encode(items)
        except (TypeError, ValueError):
            logger.exception("span batch not encoded")
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if client.export(data).success else SpanExportResult.FAILURE

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Send ``spans`` in one request (see :meth:`export_notes`)."""
        return self.export_notes(spans)


def _linked(item: ReadableSpan | RequestTrace) -> bool:
    """Whether ``item`` is a span with links (a request's spans never have any)."""
    return not isinstance(item, RequestTrace) and bool(item.links)
