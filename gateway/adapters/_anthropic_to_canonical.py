"""Anthropic answers -> canonical chat: the message, and SSE events as chunk dicts.

Claude's thinking is kept as LiteLLM carries it on chat: its text as ``reasoning_content``
(what every surface renders as reasoning), and each ``thinking`` block (with its signature)
or ``redacted_thinking`` block (its ``data``) in ``thinking_blocks``, in order, unchanged: the
signature is what lets a client send the block back on its next turn. A block that Claude's
interleaved thinking gave after the message's text or a tool call has ``after``: how many of
the message's items (its text, then each tool call) came before it (absent: none). Streamed,
the text comes as ``reasoning_content`` deltas and each block whole, in a ``thinking_blocks``
delta, when it ends (a ``thinking`` block at its ``content_block_stop``, a redacted one at
its start).

Streamed, the first chunk also carries what Claude's ``message_start`` counted (the input
and cache tokens, in the chat shape) under ``START_USAGE``, for the Messages renderer's own
``message_start``; the chat renderer drops it (chat clients get usage in one chunk, at the end).

Public names are re-exported by ``gateway.adapters.anthropic_wire``.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from gateway.adapters.answer_fields import (
    bad_answer,
    new_id,
    object_field,
    text_field,
)
from gateway.adapters.provider_usage import cached_usage, one_hour_writes, provider_counts
from schemas import UpstreamError
from schemas.canonical_markers import CLAUDE_STOP_REASON as STOP_REASON
from schemas.canonical_markers import START_USAGE

JSON = dict[str, Any]

FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
# The HTTP status each in-stream error type stands for, so UpstreamError's
# counts_against_endpoint and the gateway's status table treat it like the same HTTP answer.
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_encoder = msgspec.json.Encoder()


def finish_reason(stop_reason: Any) -> str:
    """The chat ``finish_reason`` for an Anthropic ``stop_reason`` (unknown ones: ``stop``)."""
    return FINISH_REASONS.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def chat_usage(usage: Any) -> JSON | None:
    """Chat usage from Anthropic usage (None when a count is not a number)."""
    return cached_usage(
        provider_counts(
            usage,
            "input_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "output_tokens",
        ),
        one_hour_writes(usage),
    )


class UpstreamStreamError(UpstreamError):
    """The Anthropic upstream sent an ``error`` event mid-stream.

    ``error_type`` is Anthropic's (``overloaded_error``...); ``status`` is the HTTP status
    that type stands for (None when unknown, which counts against the endpoint).
    """

    def __init__(self, message: str, *, error_type: str, endpoint: str = "") -> None:
        super().__init__(
            message, endpoint=endpoint, status=_ERROR_STATUS.get(error_type), kind="stream_error"
        )
        self.error_type = error_type


class MessagesToChatStream:
    """Turns parsed Anthropic SSE events into canonical chat chunks, in order.

    The role rides on the first chunk that carries content, so a stream that fails before
    producing anything yields no chunk at all (and may still fall back). The finish chunk and
    the usage chunk come only at ``message_stop``: a stream cut before it never looks done,
    and one that never gave a ``stop_reason`` ends with none. ``claude_stop``: the finish
    chunk's choice also has Claude's own under :data:`STOP_REASON` (for a Messages client).
    Raises UpstreamStreamError on an ``error`` event, UpstreamBadResponseError on an event
    that breaks the API's shapes (see :meth:`feed`).
    """

    __slots__ = (
        "_bare",
        "_claude_stop",
        "_complete",
        "_created",
        "_id",
        "_include_usage",
        "_model",
        "_role_sent",
        "_signed_blocks",
        "_started",
        "_stop_reason",
        "_stop_sequence",
        "_texted",
        "_thinking",
        "_tools",
        "_usage",
    )

    def __init__(
        self, model: str, *, include_usage: bool = True, claude_stop: bool = False
    ) -> None:
        self._model = model
        self._claude_stop = claude_stop
        self._include_usage = include_usage
        self._id = new_id("chatcmpl-")
        self._created = int(time.time())
        self._role_sent = False
        self._complete = False
        self._tools: dict[int, int] = {}  # Anthropic block index -> chat tool_calls index
        self._started: set[int] = set()  # every block index a content_block_start opened
        self._bare: set[int] = set()  # tool_use blocks that have carried no input yet
        # Anthropic block index -> an open thinking block's text pieces and its signature
        self._thinking: dict[int, tuple[list[str], list[str]]] = {}
        self._texted = False  # a text block began: a thinking block after it is interleaved
        self._signed_blocks = 0  # thinking_blocks deltas sent
        self._usage: JSON | None = {}  # the provider's counts so far; None: unknown
        self._stop_reason: Any = None
        self._stop_sequence: Any = None

    @property
    def is_complete(self) -> bool:
        """True only after ``message_stop``."""
        return self._complete

    @property
    def usage(self) -> JSON | None:
        """Usage so far, in the chat shape (None: unknown)."""
        return None if self._usage is None else chat_usage(self._usage)

    def feed(self, event: str | None, data: JSON) -> list[JSON]:
        """Chunks for one event (possibly none). Raises UpstreamStreamError on ``error``, and
        UpstreamBadResponseError for an event that breaks the API's shapes: a ``message``,
        ``content_block``, ``delta`` or ``error`` that is not an object, a block ``index``
        that is not an integer, a text, thinking, signature, redacted data, stop reason or
        tool id that is not a string. (Absent
        or null is as if empty; a usage that is not an object leaves usage unknown.)"""
        if self._complete:
            return []
        kind = data.get("type") or event
        if kind == "content_block_delta":
            return self._delta(data)
        if kind == "content_block_start":
            return self._block_start(data)
        if kind == "message_start":
            message = object_field(data, "message", "a message_start")
            if type(message.get("id")) is str:
                self._id = message["id"]
            self._add_usage(message.get("usage"))
            return []
        if kind == "message_delta":
            delta = object_field(data, "delta", "a message_delta")
            self._stop_reason = text_field(delta, "stop_reason", "a message_delta")
            self._stop_sequence = text_field(delta, "stop_sequence", "a message_delta")
            self._add_usage(data.get("usage"))
            return []
        if kind == "message_stop":
            return self._stop()
        if kind == "content_block_stop":
            return self._block_stop(data)
        if kind == "error":
            error = object_field(data, "error", "an error event")
            said = text_field(error, "message", "an error") or "unknown error"
            raise UpstreamStreamError(
                f"upstream stream error: {said}",
                error_type=text_field(error, "type", "an error") or "api_error",
            )
        if kind is not None and type(kind) is not str:
            raise bad_answer("an event's 'type' is not a string")
        return []  # ping, and events newer than this module

    def _add_usage(self, usage: Any) -> None:
        # Counts are totals so far (message_delta's are cumulative): they replace, not add.
        if usage is None or self._usage is None:
            return
        if type(usage) is not dict:
            self._usage = None  # unknown for good: the attempt is billed on the estimate
            return
        self._usage.update({k: v for k, v in usage.items() if v is not None})

    def _chunk(self, delta: JSON, finish: str | None = None) -> JSON:
        chunk = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        if not self._role_sent:
            self._role_sent = True
            delta["role"] = "assistant"
            chunk[START_USAGE] = self.usage
        return chunk

    def _block_start(self, data: JSON) -> list[JSON]:
        block = object_field(data, "content_block", "a content_block_start")
        kind = block.get("type")
        self._started.add(_block_index(data))
        if kind == "text":
            self._texted = True
            text = text_field(block, "text", "a text block")
            return [self._chunk({"content": text})] if text else []
        if kind == "thinking":
            text = text_field(block, "thinking", "a thinking block")
            signature = text_field(block, "signature", "a thinking block")
            self._thinking[_block_index(data)] = ([text] if text else [], [signature or ""])
            return [self._chunk({"reasoning_content": text})] if text else []
        if kind == "redacted_thinking":
            return self._signed(place_thinking(_redacted(block), self._texted + len(self._tools)))
        if kind != "tool_use":
            return []  # server-tool blocks have no chat form
        index = _block_index(data)
        call_id, name, tool_input = _tool_use(block)
        position = self._tools[index] = len(self._tools)
        arguments = _encoder.encode(tool_input).decode() if tool_input else ""
        if not arguments:
            self._bare.add(index)
        return [
            self._chunk(
                {
                    "tool_calls": [
                        {
                            "index": position,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": arguments},
                        }
                    ]
                }
            )
        ]

    def _delta(self, data: JSON) -> list[JSON]:
        # The hot path (one event per token): exact type tests, only the keys it reads.
        delta = data.get("delta")
        if type(delta) is not dict:
            if delta is None:
                return []
            raise bad_answer("a content_block_delta's 'delta' is not an object")
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            if type(text) is not str:
                raise bad_answer("a text_delta's 'text' is not a string")
            return [self._chunk({"content": text})] if text else []
        if kind == "input_json_delta":
            fragment = delta.get("partial_json")
            if type(fragment) is not str:
                raise bad_answer("an input_json_delta's 'partial_json' is not a string")
            index = _block_index(data)
            position = self._tools.get(index)
            if position is None and fragment and index not in self._started:
                # A call's arguments with no call: dropped, the answer ended "tool_calls"
                # without one.
                raise bad_answer("an input_json_delta for a block that never started")
            if position is None or not fragment:
                return []
            if self._bare:
                self._bare.discard(index)
            return [
                self._chunk(
                    {"tool_calls": [{"index": position, "function": {"arguments": fragment}}]}
                )
            ]
        if kind == "thinking_delta":
            text = delta.get("thinking")
            if type(text) is not str:
                raise bad_answer("a thinking_delta's 'thinking' is not a string")
            if (open_block := self._thinking.get(_block_index(data))) is None or not text:
                return []
            open_block[0].append(text)
            return [self._chunk({"reasoning_content": text})]
        if kind == "signature_delta":
            signature = delta.get("signature")
            if type(signature) is not str:
                raise bad_answer("a signature_delta's 'signature' is not a string")
            if (open_block := self._thinking.get(_block_index(data))) is not None:
                open_block[1][0] = signature  # the SDK's rule: the last one stands
        return []

    def _block_stop(self, data: JSON) -> list[JSON]:
        """A thinking block's end: the whole block, signed, as a ``thinking_blocks`` delta; a
        tool_use block's that carried no input: its arguments, ``{}``."""
        index = _block_index(data)
        if index in self._bare:
            # Claude streams a call without arguments as no input at all (its whole answer
            # says {}): "" is not JSON, and clients that parse it (Codex, the OpenAI Agents
            # SDK's integrations) fail the call.
            self._bare.discard(index)
            call = {"index": self._tools[index], "function": {"arguments": "{}"}}
            return [self._chunk({"tool_calls": [call]})]
        open_block = self._thinking.pop(index, None)
        if open_block is None:
            return []
        pieces, (signature,) = open_block
        block = {"type": "thinking", "thinking": "".join(pieces), "signature": signature}
        return self._signed(place_thinking(block, self._texted + len(self._tools)))

    def _signed(self, block: JSON) -> list[JSON]:
        self._signed_blocks += 1
        return [self._chunk(signed_delta(block, self._signed_blocks - 1))]

    def _stop(self) -> list[JSON]:
        if self._complete:
            return []
        self._complete = True
        # No stop_reason, no finish_reason: the relay then ends the answer as truncated.
        stop = self._stop_reason
        final = self._chunk({}, finish_reason(stop) if stop is not None else None)
        if self._stop_reason == "stop_sequence" and isinstance(self._stop_sequence, str):
            final["choices"][0]["stop_reason"] = self._stop_sequence  # vLLM's field
        if self._claude_stop and stop is not None:
            final["choices"][0][STOP_REASON] = stop
        chunks = [final]
        if self._include_usage:
            head = {"id": self._id, "object": "chat.completion.chunk", "created": self._created}
            chunks.append({**head, "model": self._model, "choices": [], "usage": self.usage})
        return chunks


def from_messages_response(msg: JSON, *, model: str, claude_stop: bool = False) -> JSON:
    """Translate an Anthropic ``message`` into a canonical chat completion (``claude_stop``:
    its choice also has Claude's own ``stop_reason`` under :data:`STOP_REASON`).

    Raises UpstreamBadResponseError when ``msg`` breaks the Messages API's shapes: no
    ``content`` list, a content block that is not an object, a text, thinking or
    redacted_thinking block whose ``text``, ``thinking``, ``signature`` or ``data`` is not a
    string, a tool_use block whose ``id`` or ``name`` is not a string or whose
    ``input`` is not an object, a ``stop_reason`` or ``stop_sequence`` that is not a string.
    A ``usage`` that is not an object leaves the usage unknown (None).
    """
    content = msg.get("content")
    if type(content) is not list:
        raise bad_answer("the answer has no 'content' list")
    texts: list[str] = []
    calls: list[JSON] = []
    thoughts: list[str] = []
    thinking: list[JSON] = []
    for block in content:
        if type(block) is not dict:
            raise bad_answer("a content block is not an object")
        kind = block.get("type")
        if kind == "text":
            texts.append(text_field(block, "text", "a text block") or "")
        elif kind == "thinking":
            thoughts.append(text_field(block, "thinking", "a thinking block") or "")
            signature = text_field(block, "signature", "a thinking block") or ""
            thinking.append({"type": "thinking", "thinking": thoughts[-1], "signature": signature})
            place_thinking(thinking[-1], any(texts) + len(calls))
        elif kind == "redacted_thinking":
            thinking.append(place_thinking(_redacted(block), any(texts) + len(calls)))
        elif kind == "tool_use":
            call_id, name, tool_input = _tool_use(block)
            arguments = _encoder.encode(tool_input or {}).decode()
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
    message: JSON = {
        "role": "assistant",
        "content": "".join(texts) if texts or not calls else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    if thinking:
        if thought := "".join(thoughts):
            message["reasoning_content"] = thought
        message["thinking_blocks"] = thinking
    stop = text_field(msg, "stop_reason", "the answer")
    sequence = text_field(msg, "stop_sequence", "the answer")
    choice: JSON = {
        "index": 0,
        "message": message,
        "finish_reason": finish_reason(stop),
        "logprobs": None,
    }
    if stop == "stop_sequence" and sequence is not None:
        choice["stop_reason"] = sequence  # vLLM's field for the matched stop
    if claude_stop and stop is not None:
        choice[STOP_REASON] = stop
    answer_id = msg.get("id")
    return {
        "id": answer_id if type(answer_id) is str and answer_id else new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": chat_usage(msg.get("usage")),
    }


def _block_index(data: JSON) -> int:
    """An event's content block ``index`` (absent: 0). Raises UpstreamBadResponseError when
    it is not an integer."""
    index = data.get("index", 0)
    if type(index) is not int:
        raise bad_answer("a content block's 'index' is not an integer")
    return index


def signed_delta(block: JSON, index: int) -> JSON:
    """Claude's whole ``block``, the answer's ``index``-th, as a ``thinking_blocks`` delta.
    The index numbers the entries from 0, as a list in a chat delta is numbered (a
    ``tool_calls`` entry's): the OpenAI SDKs' stream accumulators merge a list's entries by
    it and refuse a second list without one."""
    block["index"] = index
    return {"thinking_blocks": [block]}


def place_thinking(block: JSON, after: int) -> JSON:
    """``block`` marked, when Claude's interleaved thinking gave it after ``after`` of the
    message's items (its text, then each tool call), so the turn can be rebuilt in order."""
    if after:
        block["after"] = after
    return block


def _redacted(block: JSON) -> JSON:
    """A redacted_thinking block as kept: its opaque ``data``. Raises
    UpstreamBadResponseError when that is not a string."""
    data = text_field(block, "data", "a redacted_thinking block")
    return {"type": "redacted_thinking", "data": data or ""}


def _tool_use(block: JSON) -> tuple[str, str, JSON | None]:
    """A tool_use block's ``id``, ``name`` and ``input``. Raises UpstreamBadResponseError when
    the id or name is not a string or the input is not an object (or absent)."""
    call_id, name, tool_input = block.get("id"), block.get("name"), block.get("input")
    if type(call_id) is not str or type(name) is not str:
        raise bad_answer("a tool_use block's 'id' or 'name' is not a string")
    if tool_input is not None and type(tool_input) is not dict:
        raise bad_answer("a tool_use block's 'input' is not an object")
    return call_id, name, tool_input
