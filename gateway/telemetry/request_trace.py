"""One request's spans: SERVER, admission, routing decision, one CLIENT span per attempt.

Attribute names follow the OpenTelemetry HTTP and GenAI semantic conventions; the gateway's
own are ``llmgw.*``; which versions' names is the process's ``Semconv`` choice. Values come
from the config, the plan and the upstream's answer, never a secret: a credential appears
only as its ``k-…`` id, and prompt and completion text only when the operator opted in to
content capture (bounded, see gateway.telemetry.content). Attributes are built once, at each
span's end, from what the request already holds (the attempt's Observation), so a span costs
its SDK bookkeeping and little more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind, Status, StatusCode

from gateway.telemetry import content
from gateway.telemetry.names import operation_name, provider_name

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Iterator

    from opentelemetry.context import Context

    from gateway.adapters.base import JSON, Adapter, Batch, UpstreamTarget
    from gateway.http.request import HttpRequest
    from gateway.steering.resolver import Resolution
    from gateway.telemetry.provider import Telemetry
    from gateway.telemetry.recorded_span import RecordedSpan
    from schemas import Observation, RouteCandidate, RoutePlan, RouteRequest

HEDGE_PRIMARY, HEDGE_BACKUP = "primary", "backup"
# The members, read once: SpanKind.X is an attribute lookup through the Enum's metaclass.
_SERVER, _INTERNAL, _CLIENT = SpanKind.SERVER, SpanKind.INTERNAL, SpanKind.CLIENT
_DECLINED = "hedge_declined"
_MAX_SHAPES = 4096  # attempt spans' first attributes, by candidate, surface and hop
_V136_EVENTS = {
    "user": "gen_ai.user.message",
    "assistant": "gen_ai.assistant.message",
    "tool": "gen_ai.tool.message",
}


def _hedge_outcome(obs: Observation) -> str:
    if obs.outcome == "success":
        return "won"
    if obs.error_kind == _DECLINED:
        return "declined"
    return "failed"


class RequestTrace:
    """The spans of one request (owned by its RequestRecord); ``trace_id`` is 32 hex digits."""

    __slots__ = (
        "_admission",
        "_attempts",
        "_hedge",
        "_outputs",
        "_routing",
        "_t",
        "sampled",
        "server",
        "trace_id",
    )

    def __init__(
        self, telemetry: Telemetry, req: HttpRequest, route: str, parent: Context | None
    ) -> None:
        self._t = telemetry
        scope = req.scope
        server = scope.get("server")
        if server is not None and type(server) is not tuple:  # ASGI allows any iterable
            server = tuple(server)
        key = (req.method, route, scope.get("scheme", "http"), server)
        shapes = telemetry.server_shapes
        found = shapes.get(key)
        if found is None:
            if len(shapes) >= _MAX_SHAPES:
                shapes.clear()
            found = shapes[key] = _server(telemetry, *key)
        name, shape = found
        attributes = dict(shape)
        attributes["llmgw.request_id"] = req.request_id
        self.server: RecordedSpan = telemetry.spans.root(
            name, _SERVER, parent, attributes, shape, clean=True
        )
        self.trace_id = self.server.trace_id.to_bytes(16, "big").hex()  # format(): 3x the cost
        self.sampled: bool = self.server.sampled
        """Whether the sampler kept this trace (else no child span is even built)."""
        self._attempts: dict[int, RecordedSpan] = {}
        self._routing: RecordedSpan | None = None
        self._admission: RecordedSpan | None = None
        self._hedge: dict[int, str] = {}
        self._outputs: dict[int, dict[int, list[str | None]]] = {}

    # -- admission and routing ----------------------------------------------------------

    def admission_started(self) -> None:
        """The caller's limits were asked (a span until :meth:`admitted`)."""
        if self.sampled:
            self._admission = self.server.child("llmgw.admission", _INTERNAL, {})

    def admitted(self, refusal: str = "") -> None:
        """The limits' verdict came (``refusal``: the error code of a refusal)."""
        span, self._admission = self._admission, None
        if span is None:
            return
        span.set_attribute("llmgw.admission.outcome", refusal or "admitted")
        if refusal:
            span.set_attribute("error.type", refusal)
        span.end()

    def routing(self, route: RouteRequest) -> None:
        """A routing request is about to go to the model's owner (one bus round trip)."""
        self._end_routing("abandoned")
        if not self.sampled:
            return
        self._routing = self.server.child(
            "llmgw.routing",
            _INTERNAL,
            {"llmgw.routing.subject_kind": "model.route", "llmgw.model": route.model},
        )

    def routed(self, plan: RoutePlan, res: Resolution | None) -> None:
        """The owner answered ``plan`` (``res``: how a steered request was resolved)."""
        span, self._routing = self._routing, None
        if span is None:
            return
        # Every value comes from the config and the plan: the span's whole attribute set is
        # one of few, made once and shared (the encoder reuses its bytes).
        candidates = plan.candidates
        primary = candidates[0].endpoint if candidates else ""
        key: tuple[Any, ...] = (span.attributes["llmgw.model"], plan.reason, len(candidates))
        key += (primary, plan.pinned)
        if res is not None:
            key += (res.target, res.chain, res.axis, res.rule)
        shapes = self._t.routing_shapes
        shape = shapes.get(key)
        if shape is None:
            if len(shapes) >= _MAX_SHAPES:
                shapes.clear()
            shape = shapes[key] = _routed(span.attributes, plan, primary, res)
        span.reshape(shape)
        span.end()

    def _end_routing(self, error: str) -> None:
        span, self._routing = self._routing, None
        if span is not None:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR))
            span.end()

    # -- attempts -----------------------------------------------------------------------

    def hedged(self, primary: int, backup: int) -> None:
        """Attempts ``primary`` and ``backup`` race (a hedge)."""
        self._hedge[primary] = HEDGE_PRIMARY
        self._hedge[backup] = HEDGE_BACKUP

    def attempt(
        self, number: int, c: RouteCandidate, target: UpstreamTarget, surface: str, stream: bool
    ) -> UpstreamTarget:
        """Start attempt ``number``'s CLIENT span; ``target`` carrying its ``traceparent``
        (the SERVER span's when the trace is not sampled: no span is made)."""
        if not self.sampled:
            return target.traced(_trace_headers(self.server, self.trace_id))
        key = (
            c.endpoint,
            c.kind,
            c.base_url,
            c.upstream_model,
            c.credential_id,
            surface,
            stream,
            number,
        )
        shapes = self._t.attempt_shapes
        found = shapes.get(key)
        if found is None:
            if len(shapes) >= _MAX_SHAPES:
                shapes.clear()
            found = shapes[key] = self._attempt(c, surface, stream, number)
        name, shape = found
        span = self.server.child(name, _CLIENT, shape, shape)
        self._attempts[number] = span
        return target.traced(_trace_headers(span, self.trace_id))

    def _attempt(
        self, c: RouteCandidate, surface: str, stream: bool, number: int
    ) -> tuple[str, dict[str, Any]]:
        """An attempt span's name and first attributes (all from the config and the plan)."""
        operation = operation_name(surface)
        address, port = self._t.server_of(c.base_url)
        semconv = self._t.semconv
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

    def noting(self, adapter: Adapter, number: int) -> Adapter:
        """``adapter``, noting its whole answers to attempt ``number`` (:meth:`answered`)
        before the caller renders them for the client."""
        return _Noting(adapter, self, number)

    def answered(self, number: int, body: dict[str, Any]) -> None:
        """Note the upstream's answer (or first chunk) to attempt ``number``: response id,
        model and finish reasons (never its content)."""
        span = self._attempts.get(number)
        if span is None:
            return
        rid, model = body.get("id"), body.get("model")
        attributes = span.attributes  # none of these keys is shaped, no value None
        if isinstance(rid, str) and rid:
            attributes["gen_ai.response.id"] = rid
        if isinstance(model, str) and model:
            attributes["gen_ai.response.model"] = model
        reasons = tuple(_reasons(body.get("choices")))  # a tuple, as the SDK keeps a list
        if reasons:
            attributes["gen_ai.response.finish_reasons"] = reasons

    # -- content capture (only when opted in: see Telemetry.capture_content) --------------

    @property
    def capturing(self) -> bool:
        """Whether message content goes on the attempt spans (the operator opted in)."""
        return self._t.capture_content

    def prompt(self, number: int, body: dict[str, Any]) -> None:
        """Put the request's messages on attempt ``number``'s span."""
        span = self._attempts.get(number)
        if span is None:
            return
        limit = self._t.capture_max_chars
        system, messages = content.input_messages(body, limit)
        if self._t.semconv.genai_latest:
            if system:
                span.set_attribute("gen_ai.system_instructions", content.dumps(system))
            span.set_attribute("gen_ai.input.messages", content.dumps(messages))
            return
        # v1.36.0: one event per message (its body's content as JSON; gen_ai.system is
        # the span's own attribute).
        if system:
            span.add_event("gen_ai.system.message", {"content": content.dumps(system)})
        for message in messages:
            span.add_event(
                _V136_EVENTS.get(message["role"], "gen_ai.user.message"),
                {"content": content.dumps(message["parts"])},
            )

    def completed(self, number: int, body: dict[str, Any]) -> None:
        """Put a whole answer's text on attempt ``number``'s span."""
        span = self._attempts.get(number)
        if span is not None:
            self._output(span, content.answer_choices(body))

    def streamed(self, number: int, batch: Iterable[dict[str, Any]]) -> None:
        """Add a streamed batch's text to attempt ``number``'s answer (put on the span as
        the attempt ends)."""
        choices = self._outputs.setdefault(number, {})
        for chunk in batch:
            for choice in chunk.get("choices") or ():
                if not isinstance(choice, dict):
                    continue
                parts = choices.setdefault(choice.get("index") or 0, [None])
                text = (choice.get("delta") or {}).get("content")
                if isinstance(text, str):
                    parts.append(text)
                if isinstance(choice.get("finish_reason"), str):
                    parts[0] = choice["finish_reason"]

    def _output(self, span: RecordedSpan, choices: list[tuple[str, str | None]]) -> None:
        messages = content.output_messages(choices, self._t.capture_max_chars)
        if self._t.semconv.genai_latest:
            span.set_attribute("gen_ai.output.messages", content.dumps(messages))
            return
        for index, message in enumerate(messages):
            span.add_event(
                "gen_ai.choice",
                {
                    "index": index,
                    "finish_reason": message["finish_reason"],
                    "content": content.dumps(message["parts"]),
                },
            )

    def finished(self, number: int, reason: str) -> None:
        """A streamed attempt said why it stopped."""
        span = self._attempts.get(number)
        if span is not None:
            span.set_attribute("gen_ai.response.finish_reasons", (reason,))

    def attempt_done(self, obs: Observation) -> None:
        """End attempt ``obs.attempt``'s span with what its Observation says."""
        span = self._attempts.pop(obs.attempt, None)
        if span is None:
            return
        attrs = span.attributes  # none of these keys is shaped, no value None
        attrs["llmgw.model"] = obs.model
        attrs["llmgw.outcome"] = obs.outcome
        attrs["gen_ai.usage.input_tokens"] = obs.prompt_tokens
        attrs["gen_ai.usage.output_tokens"] = obs.completion_tokens
        attrs["llmgw.cost_usd"] = obs.cost_usd
        if obs.cached_tokens:
            attrs["gen_ai.usage.cache_read.input_tokens"] = obs.cached_tokens
        if obs.cache_write_tokens:
            attrs["gen_ai.usage.cache_creation.input_tokens"] = obs.cache_write_tokens
            attrs["gen_ai.usage.cache_write.input_tokens"] = obs.cache_write_tokens
        if obs.ttft_ms is not None:
            attrs["gen_ai.response.time_to_first_chunk"] = obs.ttft_ms / 1000
        if obs.status is not None:
            attrs["http.response.status_code"] = obs.status
            if self._t.semconv.http_old:
                attrs["http.status_code"] = obs.status
        streamed = self._outputs.pop(obs.attempt, None)
        if streamed is not None:
            self._output(span, [("".join(text), reason) for text, reason in _texts(streamed)])
        role = self._hedge.get(obs.attempt)
        if role is not None:
            attrs["llmgw.hedge.role"] = role
            attrs["llmgw.hedge.outcome"] = _hedge_outcome(obs)
        if obs.outcome != "success" and obs.error_kind:
            attrs["error.type"] = obs.error_kind
            if obs.outcome != "cancelled":
                span.set_status(Status(StatusCode.ERROR))
        span.end()

    # -- the end ------------------------------------------------------------------------

    def finish(self, status: int, kind: str) -> None:
        """End the request's spans: the SERVER span with the client's HTTP ``status``
        (``kind``: the error code, "" on success); any span still open ends as abandoned."""
        if self._admission is not None:
            self.admitted("abandoned")
        self._end_routing(kind or "abandoned")
        for span in self._attempts.values():
            span.set_attribute("error.type", "abandoned")
            span.end()
        self._attempts.clear()
        server = self.server
        attributes = server.attributes  # none of these keys is shaped, no value None
        attributes["http.response.status_code"] = status
        if self._t.semconv.http_old:
            attributes["http.status_code"] = status
        if kind:
            attributes["error.type"] = kind
        if status >= 500:
            server.set_status(Status(StatusCode.ERROR))
        server.end()


def _routed(
    started: dict[str, Any], plan: RoutePlan, primary: str, res: Resolution | None
) -> dict[str, Any]:
    """A routing span's attributes once answered: ``started``'s, then the decision's."""
    attrs: dict[str, Any] = {
        **started,
        "llmgw.routing.strategy": plan.reason,
        "llmgw.routing.candidates": len(plan.candidates),
        "llmgw.routing.primary": primary,
        "llmgw.routing.pinned": plan.pinned,
    }
    if res is not None:
        attrs["llmgw.routing.target"] = res.target
        if res.chain:
            attrs["llmgw.routing.chain"] = res.chain
        if res.axis:
            attrs["llmgw.routing.axis"] = res.axis
        if res.rule:
            attrs["llmgw.routing.rule"] = res.rule
    return attrs


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


def _trace_headers(span: RecordedSpan, trace_id: str) -> dict[str, str]:
    """W3C trace context headers of ``span`` (``trace_id``: its 32 hex digits), as the SDK's
    propagator writes them."""
    flags = "-01" if span.sampled else "-00"
    headers = {"traceparent": f"00-{trace_id}-{span.span_id.to_bytes(8, 'big').hex()}{flags}"}
    if span.trace_state:
        headers["tracestate"] = span.trace_state.to_header()
    return headers


def _reasons(choices: Any) -> Iterator[str]:
    """The finish reasons of an answer's ``choices`` (those that are strings)."""
    for choice in choices or ():
        if isinstance(choice, dict):
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                yield reason


def _texts(streamed: dict[int, list[str | None]]) -> list[tuple[list[str], str | None]]:
    """A stream's gathered choices in index order: (text pieces, finish reason)."""
    return [
        ([p for p in parts[1:] if p is not None], parts[0]) for _, parts in sorted(streamed.items())
    ]


class _Noting:
    """An adapter whose whole answers are noted on a trace as they arrive."""

    __slots__ = ("_adapter", "_number", "_trace")

    def __init__(self, adapter: Adapter, trace: RequestTrace, number: int) -> None:
        self._adapter, self._trace, self._number = adapter, trace, number

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        capture = self._trace.capturing
        if capture:
            self._trace.prompt(self._number, body)
        answer = await self._adapter.complete(target, body)
        self._trace.answered(self._number, answer)
        if capture:
            self._trace.completed(self._number, answer)
        return answer

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        answer = await self._adapter.embed(target, body)
        self._trace.answered(self._number, answer)
        return answer

    def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        chunks = self._adapter.stream(target, body)
        if not self._trace.capturing:
            return chunks
        self._trace.prompt(self._number, body)
        return self._streamed(chunks)

    async def _streamed(self, chunks: AsyncIterator[Batch]) -> AsyncIterator[Batch]:
        try:
            async for batch in chunks:
                self._trace.streamed(self._number, batch)
                yield batch
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()
