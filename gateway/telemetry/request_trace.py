"""One request's trace: the hooks the ingress calls as the request goes.

A hook notes what happened, when, and what decided it (the plan's decision, the candidate,
the Observation): the replay step and its arguments added to one flat list. When the
request ends its notes go to the span batcher whole, and the export thread builds the spans
from them (gateway.telemetry.trace_replay) a batch at a time. What must be known at once is
decided at once: the sampler's decision, the ids, the ``traceparent`` an attempt sends
upstream, and what is read from an answer that is not kept (its id, model and finish
reasons; the content an operator opted in to capture, bounded).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind

from gateway.telemetry import content
from gateway.telemetry.trace_replay import Replay, replay, server_shape
from schemas.text_chunk import chunk_json

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Iterator

    from opentelemetry.context import Context

    from gateway.adapters.base import JSON, Adapter, Batch, UpstreamTarget
    from gateway.http.request import HttpRequest
    from gateway.steering.resolver import Resolution
    from gateway.telemetry.provider import Telemetry
    from gateway.telemetry.recorded_span import RecordedSpan
    from gateway.telemetry.trace_replay import ServerKey
    from schemas import Observation, RouteCandidate, RoutePlan, RouteRequest
    from schemas.text_chunk import Chunk

_now = time.time_ns
_SERVER = SpanKind.SERVER


class RequestTrace:
    """The notes of one request (owned by its RequestRecord until it ends, then by the span
    batcher); ``trace_id`` is 32 hex digits. Every hook is a no-op for an unsampled trace."""

    __slots__ = (
        "_outputs",
        "eager_server",
        "notes",
        "remote_parent",
        "request_id",
        "sampled",
        "server_key",
        "span_count",
        "span_id",
        "start_time",
        "telemetry",
        "trace_id",
        "trace_int",
        "trace_state",
    )

    def __init__(
        self, telemetry: Telemetry, req: HttpRequest, route: str, parent: Context | None
    ) -> None:
        self.telemetry = telemetry
        self.start_time = _now()
        scope = req.scope
        server = scope.get("server")
        if server is not None and type(server) is not tuple:  # ASGI allows any iterable
            server = tuple(server)
        self.server_key: ServerKey = (req.method, route, scope.get("scheme", "http"), server)
        self.request_id = req.request_id
        self.notes: list[Any] = []
        """Replay method, time in ns, its other arguments; the next method... in the order
        they happened. Flat, and holding no container made for the request (a RoutePlan
        holds tuples): the notes wait for their batch, and objects the collector tracks
        waiting that long cost collections while they wait (those of the Observation and
        candidate, msgspec structs of plain values, are not tracked)."""
        self.span_count = 1
        """The spans the notes will make (the SERVER span and each one started)."""
        self._outputs: dict[int, dict[int, list[str | None]]] | None = None
        recorder = telemetry.spans
        decided = recorder.decide(parent)
        self.eager_server: RecordedSpan | None = None
        """The SERVER span, made at once when the sampler must see its name and attributes
        (a sampler that is not one of the SDK's stock ones); None: made from the notes."""
        if decided is None:
            name, shape = server_shape(telemetry, self.server_key)
            attributes = dict(shape)
            attributes["llmgw.request_id"] = req.request_id
            span = recorder.root(name, _SERVER, parent, attributes, shape, clean=True)
            self.eager_server = span
            decided = (span.trace_id, span.trace_state, span.remote_parent, span.sampled)
            self.span_id = span.span_id
        else:
            self.span_id = recorder.new_span_id()
        self.trace_int, self.trace_state, self.remote_parent, self.sampled = decided
        self.trace_id = self.trace_int.to_bytes(16, "big").hex()  # format(): 3x the cost

    # -- admission and routing ----------------------------------------------------------

    def admission_started(self) -> None:
        """The caller's limits were asked (a span until :meth:`admitted`)."""
        if self.sampled:
            self.span_count += 1
            self.notes += (Replay.admission_started, _now())

    def admitted(self, refusal: str = "") -> None:
        """The limits' verdict came (``refusal``: the error code of a refusal)."""
        if self.sampled:
            self.notes += (Replay.admitted, _now(), refusal)

    def routing(self, route: RouteRequest) -> None:
        """A routing request is about to go to the model's owner (one bus round trip)."""
        if self.sampled:
            self.span_count += 1
            self.notes += (Replay.routing, _now(), route.model)

    def routed(self, plan: RoutePlan, res: Resolution | None) -> None:
        """The owner answered ``plan`` (``res``: how a steered request was resolved)."""
        if self.sampled:
            candidates = plan.candidates
            primary = candidates[0].endpoint if candidates else ""
            reason, count, pinned = plan.reason, len(candidates), plan.pinned
            self.notes += (Replay.routed, _now(), reason, count, primary, pinned, res)

    # -- attempts -----------------------------------------------------------------------

    def hedged(self, primary: int, backup: int) -> None:
        """Attempts ``primary`` and ``backup`` race (a hedge)."""
        if self.sampled:
            self.notes += (Replay.hedged, 0, primary, backup)

    def attempt(
        self, number: int, c: RouteCandidate, target: UpstreamTarget, surface: str, stream: bool
    ) -> UpstreamTarget:
        """Start attempt ``number``'s CLIENT span; ``target`` carrying its ``traceparent``
        (the SERVER span's when the trace is not sampled: no span is made)."""
        if not self.sampled:
            return target.traced(_trace_headers(self, self.span_id, "-00"))
        span_id = self.telemetry.spans.new_span_id()
        self.span_count += 1
        self.notes += (Replay.attempt, _now(), number, c, surface, stream, span_id)
        return target.traced(_trace_headers(self, span_id, "-01"))

    def noting(self, adapter: Adapter, number: int) -> Adapter:
        """``adapter``, noting its whole answers to attempt ``number`` (:meth:`answered`)
        before the caller renders them for the client."""
        return _Noting(adapter, self, number)

    def answered(self, number: int, body: dict[str, Any]) -> None:
        """Note the upstream's answer (or first chunk) to attempt ``number``: response id,
        model and finish reasons (never its content)."""
        if not self.sampled:
            return
        choices = body.get("choices")
        first = choices[0] if type(choices) is list and len(choices) == 1 else None
        reason = first.get("finish_reason") if type(first) is dict else None
        # One choice with its reason (nearly every answer): the string itself, no tuple made
        # (nor the loop below's frame).
        reasons = reason if type(reason) is str else tuple(_reasons(choices))
        self.notes += (Replay.answered, 0, number, body.get("id"), body.get("model"), reasons)

    # -- content capture (only when opted in: see Telemetry.capture_content) --------------

    @property
    def capturing(self) -> bool:
        """Whether message content goes on the attempt spans (the operator opted in)."""
        return self.telemetry.capture_content

    def prompt(self, number: int, body: dict[str, Any]) -> None:
        """Put the request's messages on attempt ``number``'s span."""
        if self.sampled:
            system, messages = content.input_messages(body, self.telemetry.capture_max_chars)
            self.notes += (Replay.prompt, _now(), number, system, messages)

    def completed(self, number: int, body: dict[str, Any]) -> None:
        """Put a whole answer's text on attempt ``number``'s span."""
        if self.sampled:
            self.notes += (Replay.output, _now(), number, content.answer_choices(body))

    def streamed(self, number: int, batch: Iterable[Chunk]) -> None:
        """Add a streamed batch's text to attempt ``number``'s answer (put on the span as
        the attempt ends)."""
        if not self.sampled:
            return
        if self._outputs is None:
            self._outputs = {}
        choices = self._outputs.setdefault(number, {})
        for chunk in map(chunk_json, batch):
            for choice in chunk.get("choices") or ():
                if not isinstance(choice, dict):
                    continue
                parts = choices.setdefault(choice.get("index") or 0, [None])
                text = (choice.get("delta") or {}).get("content")
                if isinstance(text, str):
                    parts.append(text)
                if isinstance(choice.get("finish_reason"), str):
                    parts[0] = choice["finish_reason"]

    def finished(self, number: int, reason: str) -> None:
        """A streamed attempt said why it stopped."""
        if self.sampled:
            self.notes += (Replay.finished, 0, number, reason)

    def attempt_done(self, obs: Observation, at: int | None = None) -> None:
        """End attempt ``obs.attempt``'s span with what its Observation says, at ``at`` (ns
        since the epoch; default now)."""
        if not self.sampled:
            return
        text = None
        if self._outputs is not None:
            streamed = self._outputs.pop(obs.attempt, None)
            if streamed is not None:
                text = [("".join(parts), reason) for parts, reason in _texts(streamed)]
        self.notes += (Replay.attempt_done, _now() if at is None else at, obs, text)

    # -- the end ------------------------------------------------------------------------

    def finish(self, status: int, kind: str) -> None:
        """End the request's spans: the SERVER span with the client's HTTP ``status``
        (``kind``: the error code, "" on success); any span still open ends as abandoned.
        The notes go to the span processor (built into spans on its thread when it is the
        gateway's batcher, here otherwise)."""
        if not self.sampled:
            return
        self.notes += (Replay.finish, _now(), status, kind)
        recorder = self.telemetry.spans
        if recorder.take_notes is not None:
            recorder.take_notes(self)
            return
        for span in replay(self):
            recorder.processor.on_end(span)  # type: ignore[arg-type]  # read as a ReadableSpan


def _trace_headers(trace: RequestTrace, span_id: int, flags: str) -> dict[str, str]:
    """W3C trace context headers of span ``span_id`` of ``trace`` (``flags``: "-01" sampled,
    "-00" not), as the SDK's propagator writes them."""
    headers = {"traceparent": f"00-{trace.trace_id}-{span_id.to_bytes(8, 'big').hex()}{flags}"}
    if trace.trace_state:
        headers["tracestate"] = trace.trace_state.to_header()
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
