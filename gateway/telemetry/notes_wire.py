"""A plain request's spans encoded straight from its notes, no span object made.

Nearly every request a gateway serves is routed once and served by its first attempt: its
notes (gateway.telemetry.request_trace) are always the same six steps (seven for a stream
that said why it stopped). For those, the export
thread writes the three spans' OTLP fields from the notes themselves, with the same shapes,
attribute pairs and cached bytes as the replay (gateway.telemetry.trace_replay) and the
encoder (gateway.telemetry.otlp_wire) would use, so the bytes are the same (a test compares
them); making the span objects and their attribute dicts only to read them back cost about
as much as encoding them. Any other request (admitted by limits, failed over, hedged,
refused, captured, answered 5xx, its SERVER span made at once) is replayed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opentelemetry.trace import SpanKind

from gateway.telemetry.trace_replay import (
    Replay,
    answer_pairs,
    attempt_shape,
    done_pairs,
    finish_pairs,
    routing_shape,
    server_shape,
)

if TYPE_CHECKING:
    from gateway.telemetry.otlp_wire import SpanEncoder
    from gateway.telemetry.request_trace import RequestTrace

__all__ = ["plain_spans"]

_SERVER, _INTERNAL, _CLIENT = SpanKind.SERVER, SpanKind.INTERNAL, SpanKind.CLIENT
_ROUTING_NAME = "llmgw.routing"
# The steps of a plain request's notes and where each sits (each step's values follow it).
_STEPS = (
    (0, Replay.routing),
    (3, Replay.routed),
    (10, Replay.attempt),
    (17, Replay.answered),
    (23, Replay.attempt_done),
    (27, Replay.finish),
)
_LENGTH = 31
_FINISHED = 23  # where a stream's finish reason is noted, between the answer and the end
_REASONS = "gen_ai.response.finish_reasons"


def plain_spans(encoder: SpanEncoder, trace: RequestTrace) -> list[bytes] | None:
    """The ScopeSpans' fields of ``trace``'s spans (routing, attempt, SERVER, in the order
    they ended) when it is a plain request; None for any other (replay it)."""
    notes = trace.notes
    finished: tuple[Any, ...] = ()
    if len(notes) == _LENGTH + 4 and notes[_FINISHED] is Replay.finished:
        # A stream that said why it stopped: the plain steps around its finish reason.
        finished = tuple(notes[_FINISHED + 2 : _FINISHED + 4])  # (attempt, reason)
        notes = notes[:_FINISHED] + notes[_FINISHED + 4 :]
    if len(notes) != _LENGTH or trace.eager_server is not None:
        return None
    for at, step in _STEPS:
        if notes[at] is not step:
            return None
    (
        *_,
        routing_at,
        model,
        _,
        routed_at,
        reason,
        candidates,
        primary,
        pinned,
        res,
        _,
        attempt_at,
        number,
        candidate,
        surface,
        stream,
        attempt_id,
        _,
        _,
        answered_number,
        rid,
        answered_model,
        reasons,
        _,
        done_at,
        obs,
        streamed,
        _,
        end_at,
        status,
        kind,
    ) = notes
    if (
        (finished and finished[0] != number)
        or answered_number != number
        or obs.attempt != number
        or obs.outcome != "success"
        or streamed is not None
        or kind
        or status >= 500
    ):
        return None
    telemetry = trace.telemetry
    http_old = telemetry.semconv.http_old
    trace_id, server_id, state = trace.trace_int, trace.span_id, trace.trace_state
    ids, timing, block, shaped = encoder.ids, encoder.timing, encoder.block, encoder.shaped

    routing_id = telemetry.spans.new_span_id()  # drawn where the replay draws it
    shape = routing_shape(telemetry, model, reason, candidates, primary, pinned, res)
    routing = shaped(
        ids(trace_id, routing_id, server_id, state),
        timing(_INTERNAL, routing_at, routed_at),
        block(shape, _ROUTING_NAME, False),
        [],
    )
    name, shape = attempt_shape(telemetry, candidate, surface, stream, number)
    added: list[tuple[str, Any]] = answer_pairs(rid, answered_model, reasons)
    if finished:  # as the replay sets it: in the answer's place, or after its pairs
        answered = dict(added)
        answered[_REASONS] = (finished[1],)
        added = list(answered.items())
    attempt = shaped(
        ids(trace_id, attempt_id, server_id, state),
        timing(_CLIENT, attempt_at, done_at),
        block(shape, name, False),
        added + done_pairs(obs, http_old),
    )
    name, shape = server_shape(telemetry, trace.server_key)
    remote = trace.remote_parent
    added = [("llmgw.request_id", trace.request_id), *finish_pairs(status, kind, http_old)]
    server = shaped(
        ids(trace_id, server_id, remote.span_id if remote is not None else 0, state),
        timing(_SERVER, trace.start_time, end_at),
        block(shape, name, remote is not None),
        added,
    )
    return [routing, attempt, server]
