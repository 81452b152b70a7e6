"""ConverseStream events -> canonical ``chat.completion.chunk`` dicts (pure).

Fed one decoded event at a time (``:event-type`` and its JSON payload), in order. The role
rides on the first chunk that carries content, so a stream that fails before producing
anything yields no chunk at all (and may still fall back). ``messageStop`` says why the
answer ended and ``metadata`` (which follows it) carries usage: the finish chunk comes with
``metadata``, or at :meth:`ConverseToChatStream.finish` when the body ends after
``messageStop`` without it. A stream that ends before ``messageStop`` never looks done.
Reasoning text comes as ``reasoning_content`` deltas; Claude's signed or redacted block also
comes whole, in a ``thinking_blocks`` delta, at its ``contentBlockStop``. With
``claude_stop``, a stop reason of Claude's that chat has no finish reason for
(:data:`CLAUDE_STOPS`) is also on the finish chunk's choice, as the anthropic adapter puts it.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.adapters._anthropic_to_canonical import place_thinking, signed_delta
from gateway.adapters.answer_fields import bad_answer, new_id, object_field, text_field
from gateway.adapters.bedrock_wire import (
    JSON,
    chat_usage,
    finish_reason,
    reasoning_block,
    tool_use,
)
from schemas.canonical_markers import CLAUDE_STOP_REASON as STOP_REASON

MATCHED_STOP = "/stop_sequence"
"""The response field path that asks Claude on Converse which stop sequence ended its answer
(``additionalModelResponseFields.stop_sequence``): ``stopReason`` says only that one did."""
CLAUDE_STOPS = frozenset({"model_context_window_exceeded"})
"""Converse stop reasons of Claude's own that chat has no finish reason for (``length``
stands in): kept for a Messages client (``_claude_native``) as the anthropic adapter keeps
them."""


def matched_stop(payload: JSON) -> str | None:
    """The stop sequence that a Converse answer or ``messageStop`` says ended the answer
    (Claude's, asked for with :data:`MATCHED_STOP`), or None."""
    if payload.get("stopReason") != "stop_sequence":
        return None
    fields = payload.get("additionalModelResponseFields")
    matched = fields.get("stop_sequence") if type(fields) is dict else None
    return matched if type(matched) is str else None


class ConverseToChatStream:
    """Translates one ConverseStream answer; ``is_complete`` once nothing more may follow."""

    def __init__(self, model: str, *, include_usage: bool, claude_stop: bool = False) -> None:
        self._id = new_id("chatcmpl-")
        self._claude_stop = claude_stop
        self._stop: str | None = None  # messageStop's own, when one of CLAUDE_STOPS
        self._created = int(time.time())
        self._model = model
        self._include_usage = include_usage
        self._role_sent = False
        self._tools: dict[int, int] = {}  # contentBlockIndex -> tool_calls index
        self._bare: set[int] = set()  # tool uses that have carried no input yet
        self._finish: str | None = None  # from messageStop
        self._matched: str | None = None  # the stop sequence messageStop says ended it
        self._texted = False  # text came: a reasoning block after it is interleaved
        # contentBlockIndex -> a reasoning block's text pieces, signature, redacted pieces
        self._reasoning: dict[int, tuple[list[str], list[str], list[str]]] = {}
        self._signed_blocks = 0  # thinking_blocks deltas sent
        self.is_complete = False

    def feed(self, event: str, payload: JSON) -> list[JSON]:
        """The chunks ``event`` yields (often none). Raises UpstreamBadResponseError for an
        event that breaks ``ConverseStreamOutput``'s shapes: a ``start``, ``delta``,
        ``toolUse`` or ``reasoningContent`` that is not an object, a ``contentBlockIndex``
        that is not an integer, a text, tool input, tool use id or name or ``stopReason``
        that is not a string. (Absent or null is as if empty; a ``usage`` that is not an
        object leaves the usage unknown.)"""
        if event == "contentBlockDelta":
            return self._delta(payload)
        if event == "contentBlockStart":
            use = object_field(payload, "start", "a contentBlockStart").get("toolUse")
            if use is None:
                return []
            call_id, name, _ = tool_use(use, "a contentBlockStart")
            block = _index(payload)
            index = self._tools.setdefault(block, len(self._tools))
            self._bare.add(block)
            call = {
                "index": index,
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": ""},
            }
            return [self._chunk({"tool_calls": [call]})]
        if event == "messageStop":
            stop = text_field(payload, "stopReason", "a messageStop") or "end_turn"
            self._finish = finish_reason(stop)
            self._stop = stop if self._claude_stop and stop in CLAUDE_STOPS else None
            self._matched = matched_stop(payload)
            return []
        if event == "metadata":
            return self._end(payload.get("usage"))
        if event == "contentBlockStop" and self._bare and _index(payload) in self._bare:
            # A call without arguments streams no input (the whole answer says {}): "" is
            # not JSON, and clients that parse it fail the call.
            self._bare.discard(block := _index(payload))
            call = {"index": self._tools[block], "function": {"arguments": "{}"}}
            return [self._chunk({"tool_calls": [call]})]
        if event == "contentBlockStop" and self._reasoning:
            return self._reasoning_stop(payload)
        return []  # messageStart, other blocks' stops, and events this gateway does not use

    def finish(self) -> list[JSON]:
        """The closing chunks when the body ended after ``messageStop`` without
        ``metadata``; None-equivalent (empty, not complete) when it ended before."""
        if self._finish is None or self.is_complete:
            return []
        return self._end(None)

    def _delta(self, payload: JSON) -> list[JSON]:
        # The hot path (one event per few tokens): exact type tests, only the keys it reads.
        delta = payload.get("delta")
        if type(delta) is not dict:
            if delta is None:
                return []
            raise bad_answer("a contentBlockDelta's 'delta' is not an object")
        text = delta.get("text")
        if text is not None:
            if type(text) is not str:
                raise bad_answer("a contentBlockDelta's 'text' is not a string")
            self._texted = True
            return [self._chunk({"content": text})] if text else []
        use = delta.get("toolUse")
        if use is not None:
            fragment = object_field(delta, "toolUse", "a contentBlockDelta").get("input")
            if type(fragment) is not str:
                raise bad_answer("a contentBlockDelta's tool use 'input' is not a string")
            at = _index(payload)
            index = self._tools.setdefault(at, len(self._tools))
            if fragment and self._bare:
                self._bare.discard(at)
            call = {"index": index, "function": {"arguments": fragment}}
            return [self._chunk({"tool_calls": [call]})]
        reasoning = object_field(delta, "reasoningContent", "a contentBlockDelta")
        thought = text_field(reasoning, "text", "a reasoningContent delta")
        signature = text_field(reasoning, "signature", "a reasoningContent delta")
        redacted = text_field(reasoning, "redactedContent", "a reasoningContent delta")
        if thought or signature or redacted:  # kept until the block ends, for Claude's
            block = self._reasoning.setdefault(_index(payload), ([], [""], []))
            if thought:
                block[0].append(thought)
            if signature:
                block[1][0] = signature
            if redacted:
                block[2].append(redacted)
        return [self._chunk({"reasoning_content": thought})] if thought else []

    def _reasoning_stop(self, payload: JSON) -> list[JSON]:
        """A reasoning block's end: Claude's, signed or redacted, whole (other models' none)."""
        pieces = self._reasoning.pop(_index(payload), None)
        if pieces is None:
            return []
        thought, (signature,), redacted = pieces
        block = reasoning_block("".join(thought), signature, "".join(redacted))
        if block is None:
            return []
        place_thinking(block, self._texted + len(self._tools))
        self._signed_blocks += 1
        return [self._chunk(signed_delta(block, self._signed_blocks - 1))]

    def _end(self, usage: Any) -> list[JSON]:
        self.is_complete = True
        out = [self._chunk({}, self._finish)]
        if self._stop is not None:
            out[0]["choices"][0][STOP_REASON] = self._stop
        if self._matched is not None:
            out[0]["choices"][0]["stop_reason"] = self._matched  # vLLM's field, as Claude's
        if self._include_usage:
            out.append(self._base([], usage=chat_usage(usage)))
        return out

    def _chunk(self, delta: JSON, finish: str | None = None) -> JSON:
        if not self._role_sent:
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return self._base([choice])

    def _base(self, choices: list[JSON], **extra: Any) -> JSON:
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": choices,
            **extra,
        }


def _index(payload: JSON) -> int:
    """An event's ``contentBlockIndex`` (absent: 0). Raises UpstreamBadResponseError when it
    is not an integer."""
    index = payload.get("contentBlockIndex")
    if type(index) is int:
        return index
    if index is None:
        return 0
    raise bad_answer("an event's 'contentBlockIndex' is not an integer")
