"""Anthropic answers -> canonical chat: the message, and SSE events as chunk dicts.

Public names are re-exported by ``gateway.adapters.anthropic_wire``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgspec

from schemas import UpstreamBadResponseError, UpstreamError

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


def new_id(prefix: str) -> str:
    """A fresh random id such as ``chatcmpl-3f2a...``."""
    return prefix + os.urandom(12).hex()


def finish_reason(stop_reason: Any) -> str:
    """The chat ``finish_reason`` for an Anthropic ``stop_reason`` (unknown ones: ``stop``)."""
    return FINISH_REASONS.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def provider_counts(usage: Any, *keys: str) -> list[int] | None:
    """A provider's token counts under ``keys``, in order (absent or null: 0); None when one
    is not a whole number from 0: the answer's usage is then unknown (summing a string
    failed the request). How large is the adapter seam's to judge (``base.MAX_TOKENS``)."""
    if not isinstance(usage, dict):
        usage = {}
    counts = []
    for key in keys:
        value = usage.get(key)
        if value is None:
            counts.append(0)
        elif type(value) is int and value >= 0:
            counts.append(value)
        elif type(value) is float and value.is_integer() and value >= 0:
            counts.append(int(value))
        else:
            return None
    return counts


def chat_usage(usage: Any) -> JSON | None:
    """Chat usage from Anthropic usage (None when a count is not a number)."""
    return cached_usage(
        provider_counts(
            usage,
            "input_tokens",
            "cache_read_input_tokens",
            "cache_creation_input_tokens",
            "output_tokens",
        )
    )


def cached_usage(counts: list[int] | None) -> JSON | None:
    """Chat usage from a provider's (fresh input, cache reads, cache writes, output) counts:
    the chat prompt total includes cache reads and writes. None for None."""
    if counts is None:
        return None
    fresh, read, written, completion = counts
    prompt = fresh + read + written
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": read, "cache_write_tokens": written},
    }


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
    and one that never gave a ``stop_reason`` ends with none.
    Raises UpstreamStreamError on an ``error`` event.
    """

    __slots__ = (
        "_complete",
        "_created",
        "_id",
        "_include_usage",
        "_model",
        "_role_sent",
        "_stop_reason",
        "_stop_sequence",
        "_tools",
        "_usage",
    )

    def __init__(self, model: str, *, include_usage: bool = True) -> None:
        self._model = model
        self._include_usage = include_usage
        self._id = new_id("chatcmpl-")
        self._created = int(time.time())
        self._role_sent = False
        self._complete = False
        self._tools: dict[int, int] = {}  # Anthropic block index -> chat tool_calls index
        self._usage: JSON = {}
        self._stop_reason: Any = None
        self._stop_sequence: Any = None

    @property
    def is_complete(self) -> bool:
        """True only after ``message_stop``."""
        return self._complete

    @property
    def usage(self) -> JSON | None:
        """Usage so far, in the chat shape (None: unknown)."""
        return chat_usage(self._usage)

    def feed(self, event: str | None, data: JSON) -> list[JSON]:
        """Chunks for one event (possibly none). Raises UpstreamStreamError on ``error``."""
        if self._complete:
            return []
        kind = data.get("type") or event
        if kind == "content_block_delta":
            return self._delta(data)
        if kind == "content_block_start":
            return self._block_start(data)
        if kind == "message_start":
            message = data.get("message") or {}
            if isinstance(message.get("id"), str):
                self._id = message["id"]
            self._usage.update(message.get("usage") or {})
            return []
        if kind == "message_delta":
            delta = data.get("delta") or {}
            self._stop_reason = delta.get("stop_reason")
            self._stop_sequence = delta.get("stop_sequence")
            # message_delta usage counts are cumulative totals: they replace, not add.
            self._usage.update(
                {k: v for k, v in (data.get("usage") or {}).items() if v is not None}
            )
            return []
        if kind == "message_stop":
            return self._stop()
        if kind == "error":
            error = data.get("error") or {}
            raise UpstreamStreamError(
                f"upstream stream error: {error.get('message') or 'unknown error'}",
                error_type=str(error.get("type") or "api_error"),
            )
        return []  # ping, content_block_stop, and events newer than this module

    def _chunk(self, delta: JSON, finish: str | None = None) -> JSON:
        if not self._role_sent:
            self._role_sent = True
            delta["role"] = "assistant"
        return {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    def _block_start(self, data: JSON) -> list[JSON]:
        block = data.get("content_block") or {}
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            return [self._chunk({"content": block["text"]})]
        if kind != "tool_use":
            return []  # thinking and server-tool blocks have no chat form
        position = self._tools[data.get("index", 0)] = len(self._tools)
        arguments = _encoder.encode(block["input"]).decode() if block.get("input") else ""
        return [
            self._chunk(
                {
                    "tool_calls": [
                        {
                            "index": position,
                            "id": block.get("id"),
                            "type": "function",
                            "function": {"name": block.get("name"), "arguments": arguments},
                        }
                    ]
                }
            )
        ]

    def _delta(self, data: JSON) -> list[JSON]:
        delta = data.get("delta") or {}
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            return [self._chunk({"content": text})] if text else []
        if kind == "input_json_delta":
            position = self._tools.get(data.get("index", 0))
            fragment = delta.get("partial_json")
            if position is None or not fragment:
                return []
            return [
                self._chunk(
                    {"tool_calls": [{"index": position, "function": {"arguments": fragment}}]}
                )
            ]
        return []

    def _stop(self) -> list[JSON]:
        if self._complete:
            return []
        self._complete = True
        # No stop_reason, no finish_reason: the relay then ends the answer as truncated.
        stop = self._stop_reason
        final = self._chunk({}, finish_reason(stop) if stop is not None else None)
        if self._stop_reason == "stop_sequence" and isinstance(self._stop_sequence, str):
            final["choices"][0]["stop_reason"] = self._stop_sequence  # vLLM's field
        chunks = [final]
        if self._include_usage:
            chunks.append(
                {
                    "id": self._id,
                    "object": "chat.completion.chunk",
                    "created": self._created,
                    "model": self._model,
                    "choices": [],
                    "usage": self.usage,
                }
            )
        return chunks


def from_messages_response(msg: JSON, *, model: str) -> JSON:
    """Translate an Anthropic ``message`` into a canonical chat completion.

    Raises UpstreamBadResponseError when ``msg`` has no content list.
    """
    content = msg.get("content")
    if not isinstance(content, list):
        raise UpstreamBadResponseError("anthropic answer has no content", kind="bad_response")
    texts: list[str] = []
    calls: list[JSON] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(block.get("text") or "")
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name"),
                        "arguments": _encoder.encode(block.get("input") or {}).decode(),
                    },
                }
            )
    message: JSON = {
        "role": "assistant",
        "content": "".join(texts) if texts or not calls else None,
        "refusal": None,
    }
    if calls:
        message["tool_calls"] = calls
    stop = msg.get("stop_reason")
    choice: JSON = {
        "index": 0,
        "message": message,
        "finish_reason": finish_reason(stop),
        "logprobs": None,
    }
    if stop == "stop_sequence" and isinstance(msg.get("stop_sequence"), str):
        choice["stop_reason"] = msg["stop_sequence"]  # vLLM's field for the matched stop
    return {
        "id": msg.get("id") or new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": chat_usage(msg.get("usage")),
    }
