"""A request's spans built from its notes, on the span batcher's export thread.

The ingress's hooks (gateway.telemetry.request_trace) only note what happened and when: a
reference to the plan, the candidate or the Observation, and the time. Here those notes are
replayed into the request's spans (SERVER, admission, routing, one CLIENT span per attempt),
with the attribute names of the OpenTelemetry HTTP and GenAI semantic conventions (the
gateway's own are ``llmgw.*``; which versions' names is the process's ``Semconv`` choice).
Values come from the config, the plan and the upstream's answer, never a secret: a credential
appears only as its ``k-…`` id, and prompt and completion text only when the operator opted in
to content capture (bounded, see gateway.telemetry.content).

Why not build the spans as the request goes: measured through the server, the same span work
cost about three times as much done a little at a time between the request's own steps (its
objects and code evicted from the caches each time) as done a batch at a time here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from gateway.telemetry import content
from gateway.telemetry.names import operation_name, provider_name
from gateway.telemetry.recorded_span import RecordedEvent, RecordedSpan

if TYPE_CHECKING:
    from gateway.steering.resolver import Resolution
    from gateway.telemetry.provider import Telemetry
    from gateway.telemetry.request_trace import RequestTrace
    from schemas import Observation, RouteCandidate

__all__ = [
    "HEDGE_BACKUP",
    "HEDGE_PRIMARY",
    "Replay",
    "ServerKey",
    "replay",
    "replay_logged",
    "server_shape",
]

logger = logging.getLogger(__name__)

HEDGE_PRIMARY, HEDGE_BACKUP = "primary", "backup"
# The members, read once: SpanKind.X is an attribute lookup through the Enum's metaclass.
_SERVER, _INTERNAL, _CLIENT = SpanKind.SERVER, SpanKind.INTERNAL, SpanKind.CLIENT
_ERROR = Status(StatusCode.ERROR)
_DECLINED = "hedge_declined"
_MAX_SHAPES = 4096  # spans' first attributes, by what decides them
ServerKey = tuple[str, str, str, tuple[str, int | None] | None]
"""A SERVER span's method, route template, scheme and ASGI ``server``."""
_V136_EVENTS = {
    "user": "gen_ai.user.message",
    "assistant": "gen_ai.assistant.message",
    "tool": "gen_ai.tool.message",
}


def replay_logged(trace: RequestTrace) -> list[RecordedSpan]:
    """:func:`replay`, or no spans (the error logged) when the notes cannot be replayed: one
    request's notes must not lose its batch."""
    try:
        return replay(trace)
    except Exception:
        logger.exception("spans of request %s not made", trace.request_id)
        return []


def replay(trace: RequestTrace) -> list[RecordedSpan]:
    """The finished request ``trace``'s sampled spans, in the order they ended."""
    r = Replay(trace)
    notes, at, end = trace.notes, 0, len(trace.notes)
    while at < end:  # each note: a Replay method, then as many values as it takes
        step = notes[at]
        after = at + 1 + _TAKES[step]
        step(r, *notes[at + 1 : after])
        at = after
    return r.ended


class Replay:
    """One request's spans while its notes are replayed (owned by :func:`replay`); each
    note is one of the methods below, called with its time (ns since the epoch) first."""

    __slots__ = ("_admission", "_attempts", "_hedge", "_routing", "_t", "ended", "server")

    def __init__(self, trace: RequestTrace) -> None:
        telemetry = self._t = trace.telemetry
        server = trace.eager_server
        if server is None:
            name, shape = server_shape(telemetry, trace.server_key)
            attributes = dict(shape)
            attributes["llmgw.request_id"] = trace.request_id
            server = RecordedSpan.restored(
                telemetry.spans,
                name,
                _SERVER,
                trace.trace_int,
                trace.span_id,
                trace.trace_state,
                trace.remote_parent,
                attributes,
                shape,
                trace.start_time,
            )
        self.server = server
        self.ended: list[RecordedSpan] = []
        self._admission: RecordedSpan | None = None
        self._routing: RecordedSpan | None = None
        self._attempts: dict[int, RecordedSpan] = {}
        self._hedge: dict[int, str] = {}

    def _end(self, span: RecordedSpan, at: int) -> None:
        span.end_time = at
        self.ended.append(span)

    # -- admission and routing ----------------------------------------------------------

    def admission_started(self, at: int) -> None:
        span = self._admission = self.server.child("llmgw.admission", _INTERNAL, {})
        span.start_time = at

    def admitted(self, at: int, refusal: str) -> None:
        span, self._admission = self._admission, None
        if span is None:
            return
        span.attributes["llmgw.admission.outcome"] = refusal or "admitted"
        if refusal:
            span.attributes["error.type"] = refusal
        self._end(span, at)

    def routing(self, at: int, model: str) -> None:
        self._end_routing(at, "abandoned")
        started = _routing_started(model)
        span = self._routing = self.server.child("llmgw.routing", _INTERNAL, started)
        span.start_time = at

    def routed(
        self,
        at: int,
        reason: str,
        candidates: int,
        primary: str,
        pinned: bool,
        res: Resolution | None,
    ) -> None:
        """The plan's strategy, number of candidates, first endpoint and pin came."""
        span, self._routing = self._routing, None
        if span is None:
            return
        model = span.attributes["llmgw.model"]
        shape = routing_shape(self._t, model, reason, candidates, primary, pinned, res)
        span.reshape(shape)
        self._end(span, at)

    def _end_routing(self, at: int, error: str) -> None:
        span, self._routing = self._routing, None
        if span is not None:
            span.set_attribute("error.type", error)
            span.status = _ERROR
            self._end(span, at)

    # -- attempts -----------------------------------------------------------------------

    def hedged(self, at: int, primary: int, backup: int) -> None:
        self._hedge[primary] = HEDGE_PRIMARY
        self._hedge[backup] = HEDGE_BACKUP

    def attempt(
        self, at: int, number: int, c: RouteCandidate, surface: str, stream: bool, span_id: int
    ) -> None:
        name, shape = attempt_shape(self._t, c, surface, stream, number)
        span = self.server.child(name, _CLIENT, shape, shape, span_id)
        span.start_time = at
        self._attempts[number] = span

    def answered(
        self, at: int, number: int, rid: Any, model: Any, reasons: str | tuple[str, ...]
    ) -> None:
        span = self._attempts.get(number)
        if span is None:
            return
        span.attributes.update(answer_pairs(rid, model, reasons))  # none of these is shaped

    def finished(self, at: int, number: int, reason: str) -> None:
        span = self._attempts.get(number)
        if span is not None:
            span.set_attribute("gen_ai.response.finish_reasons", (reason,))

    def prompt(
        self, at: int, number: int, system: list[dict[str, Any]], messages: list[dict[str, Any]]
    ) -> None:
        span = self._attempts.get(number)
        if span is None:
            return
        if self._t.semconv.genai_latest:
            if system:
                span.set_attribute("gen_ai.system_instructions", content.dumps(system))
            span.set_attribute("gen_ai.input.messages", content.dumps(messages))
            return
        # v1.36.0: one event per message (its body's content as JSON; gen_ai.system is
        # the span's own attribute).
        if system:
            _event(span, at, "gen_ai.system.message", {"content": content.dumps(system)})
        for message in messages:
            name = _V136_EVENTS.get(message["role"], "gen_ai.user.message")
            _event(span, at, name, {"content": content.dumps(message["parts"])})

    def output(self, at: int, number: int, choices: list[tuple[str, str | None]]) -> None:
        span = self._attempts.get(number)
        if span is not None:
            self._output(span, at, choices)

    def _output(self, span: RecordedSpan, at: int, choices: list[tuple[str, str | None]]) -> None:
        messages = content.output_messages(choices, self._t.capture_max_chars)
        if self._t.semconv.genai_latest:
            span.set_attribute("gen_ai.output.messages", content.dumps(messages))
            return
        for index, message in enumerate(messages):
            attributes = {
                "index": index,
                "finish_reason": message["finish_reason"],
                "content": content.dumps(message["parts"]),
            }
            _event(span, at, "gen_ai.choice", attributes)

    def attempt_done(
        self, at: int, obs: Observation, streamed: list[tuple[str, str | None]] | None
    ) -> None:
        span = self._attempts.pop(obs.attempt, None)
        if span is None:
            return
        attrs = span.attributes
        attrs.update(done_pairs(obs, self._t.semconv.http_old))  # none of these is shaped
        if streamed is not None:
            self._output(span, at, streamed)
        role = self._hedge.get(obs.attempt)
        if role is not None:
            attrs["llmgw.hedge.role"] = role
            attrs["llmgw.hedge.outcome"] = _hedge_outcome(obs)
        if obs.outcome != "success" and obs.error_kind:
            attrs["error.type"] = obs.error_kind
            if obs.outcome != "cancelled":
                span.status = _ERROR
        self._end(span, at)

    # -- the end ------------------------------------------------------------------------

    def finish(self, at: int, status: int, kind: str) -> None:
        if self._admission is not None:
            self.admitted(at, "abandoned")
        self._end_routing(at, kind or "abandoned")
        for span in self._attempts.values():
            span.set_attribute("error.type", "abandoned")
            self._end(span, at)
        self._attempts.clear()
        server = self.server
        server.attributes.update(finish_pairs(status, kind, self._t.semconv.http_old))
        if status >= 500:
            server.status = _ERROR
        self._end(server, at)


_TAKES: dict[Any, int] = {
    method: method.__code__.co_argcount - 1  # its values: all but self
    for method in vars(Replay).values()
    if callable(method) and not method.__name__.startswith("_")
}
"""How many values each note's method takes from the notes after it."""


def routing_shape(
    telemetry: Telemetry,
    model: str,
    reason: str,
    candidates: int,
    primary: str,
    pinned: bool,
    res: Resolution | None,
) -> dict[str, Any]:
    """A routing span's whole attribute set once answered: every value comes from the config
    and the plan, so it is one of few, made once and shared (the encoder reuses its bytes)."""
    key: tuple[Any, ...] = (model, reason, candidates, primary, pinned)
    if res is not None:
        key += (res.target, res.chain, res.axis, res.rule)
    shapes = telemetry.routing_shapes
    shape = shapes.get(key)
    if shape is None:
        if len(shapes) >= _MAX_SHAPES:
            shapes.clear()
        decided = {
            "llmgw.routing.strategy": reason,
            "llmgw.routing.candidates": candidates,
            "llmgw.routing.primary": primary,
            "llmgw.routing.pinned": pinned,
        }
        shape = shapes[key] = _routed(_routing_started(model), decided, res)
    return shape


def _routing_started(model: str) -> dict[str, Any]:
    """A routing span's attributes as it starts."""
    return {"llmgw.routing.subject_kind": "model.route", "llmgw.model": model}


def attempt_shape(
    telemetry: Telemetry, c: RouteCandidate, surface: str, stream: bool, number: int
) -> tuple[str, dict[str, Any]]:
    """An attempt span's name and first attributes, shared by every attempt of its candidate,
    surface, streaming and hop."""
    key: tuple[Any, ...] = (c.endpoint, c.kind, c.base_url, c.upstream_model, c.credential_id)
    key += (surface, stream, number)
    shapes = telemetry.attempt_shapes
    found = shapes.get(key)
    if found is None:
        if len(shapes) >= _MAX_SHAPES:
            shapes.clear()
        found = shapes[key] = _attempt_shape(telemetry, c, surface, stream, number)
    return found


def answer_pairs(rid: Any, model: Any, reasons: str | tuple[str, ...]) -> list[tuple[str, Any]]:
    """An attempt span's attributes read from the upstream's answer (``reasons``: the one
    choice's finish reason, or a tuple of them)."""
    pairs: list[tuple[str, Any]] = []
    if isinstance(rid, str) and rid:
        pairs.append(("gen_ai.response.id", rid))
    if isinstance(model, str) and model:
        pairs.append(("gen_ai.response.model", model))
    if type(reasons) is str:
        pairs.append(("gen_ai.response.finish_reasons", (reasons,)))  # a tuple, as the SDK
    elif reasons:
        pairs.append(("gen_ai.response.finish_reasons", reasons))
    return pairs


def done_pairs(obs: Observation, http_old: bool) -> list[tuple[str, Any]]:
    """An attempt span's attributes from its Observation (no value None)."""
    pairs: list[tuple[str, Any]] = [
        ("llmgw.model", obs.model),
        ("llmgw.outcome", obs.outcome),
        ("gen_ai.usage.input_tokens", obs.prompt_tokens),
        ("gen_ai.usage.output_tokens", obs.completion_tokens),
        ("llmgw.cost_usd", obs.cost_usd),
    ]
    if obs.cached_tokens:
        pairs.append(("gen_ai.usage.cache_read.input_tokens", obs.cached_tokens))
    if obs.cache_write_tokens:
        pairs.append(("gen_ai.usage.cache_creation.input_tokens", obs.cache_write_tokens))
        pairs.append(("gen_ai.usage.cache_write.input_tokens", obs.cache_write_tokens))
    if obs.ttft_ms is not None:
        pairs.append(("gen_ai.response.time_to_first_chunk", obs.ttft_ms / 1000))
    if obs.status is not None:
        pairs.append(("http.response.status_code", obs.status))
        if http_old:
            pairs.append(("http.status_code", obs.status))
    return pairs


def finish_pairs(status: int, kind: str, http_old: bool) -> list[tuple[str, Any]]:
    """The SERVER span's attributes as the request ends (``kind``: its error, or "")."""
    pairs: list[tuple[str, Any]] = [("http.response.status_code", status)]
    if http_old:
        pairs.append(("http.status_code", status))
    if kind:
        pairs.append(("error.type", kind))
    return pairs


def _event(span: RecordedSpan, at: int, name: str, attributes: dict[str, Any]) -> None:
    event = RecordedEvent(name, attributes)
    event.timestamp = at
    events = span.events
    if not isinstance(events, list):  # a span without events shares the empty tuple
        events = span.events = []
    events.append(event)


def _hedge_outcome(obs: Observation) -> str:
    if obs.outcome == "success":
        return "won"
    if obs.error_kind == _DECLINED:
        return "declined"
    return "failed"


def _routed(
    started: dict[str, Any], decided: dict[str, Any], res: Resolution | None
) -> dict[str, Any]:
    """A routing span's attributes once answered: ``started``'s, the plan's ``decided``,
    then how a steered request was resolved."""
    attrs: dict[str, Any] = {**started, **decided}
    if res is not None:
        attrs["llmgw.routing.target"] = res.target
        if res.chain:
            attrs["llmgw.routing.chain"] = res.chain
        if res.axis:
            attrs["llmgw.routing.axis"] = res.axis
        if res.rule:
            attrs["llmgw.routing.rule"] = res.rule
    return attrs


def _attempt_shape(
    telemetry: Telemetry, c: RouteCandidate, surface: str, stream: bool, number: int
) -> tuple[str, dict[str, Any]]:
    """An attempt span's name and first attributes (all from the config and the plan)."""
    operation = operation_name(surface)
    address, port = telemetry.server_of(c.base_url)
    semconv = telemetry.semconv
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        semconv.provider_key: provider_name(c.kind),
        "gen_ai.request.model": c.upstream_model,
        "gen_ai.request.stream": stream,
        "server.address": address,
        "llmgw.endpoint": c.endpoint,
        "llmgw.attempt": number,
    }
    if port is not None:
        attributes["server.port"] = port
    if semconv.http_old:
        attributes["net.peer.name"] = address
        if port is not None:
            attributes["net.peer.port"] = port
    if c.credential_id:
        attributes["llmgw.credential_id"] = c.credential_id
    return f"{operation} {c.upstream_model}", attributes


def server_shape(telemetry: Telemetry, key: ServerKey) -> tuple[str, dict[str, Any]]:
    """A SERVER span's name and first attributes (shared by every request of ``key``)."""
    shapes = telemetry.server_shapes
    found = shapes.get(key)
    if found is None:
        if len(shapes) >= _MAX_SHAPES:
            shapes.clear()
        found = shapes[key] = _server(telemetry, *key)
    return found


def _server(
    telemetry: Telemetry,
    method: str,
    route: str,
    scheme: str,
    server: tuple[str, int | None] | None,
) -> tuple[str, dict[str, Any]]:
    """A SERVER span's name and first attributes (the route template, never the path)."""
    address, port = server or ("", None)
    attributes: dict[str, Any] = {
        "http.request.method": method,
        "http.route": route,
        "url.scheme": scheme,
        "server.address": address or "",
    }
    if port is not None:
        attributes["server.port"] = port
    if telemetry.semconv.http_old:  # http/dup: the old names too
        attributes |= {
            "http.method": method,
            "http.target": route,
            "http.scheme": scheme,
            "net.host.name": address or "",
        }
        if port is not None:
            attributes["net.host.port"] = port
    return f"{method} {route}", attributes
