"""Gemini answers -> canonical chat: a ``GenerateContentResponse``, and the stream of them
``streamGenerateContent?alt=sse`` sends, as chunk dicts.

Public names are re-exported by ``gateway.adapters.gemini_wire``.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from gateway.adapters._anthropic_to_canonical import new_id, provider_counts

JSON = dict[str, Any]

_FILTERED = frozenset(
    {"SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII", "RECITATION", "IMAGE_SAFETY"}
)
_encode = msgspec.json.Encoder().encode


def finish_reason(reason: Any, has_calls: bool) -> str:
    """The chat ``finish_reason`` for a Gemini ``finishReason``: ``MAX_TOKENS`` is
    ``length``, a safety, blocklist, PII or recitation stop is ``content_filter``, a stop
    with function calls is ``tool_calls``, anything else ``stop``."""
    if reason == "MAX_TOKENS":
        return "length"
    if reason in _FILTERED:
        return "content_filter"
    return "tool_calls" if has_calls else "stop"


def chat_usage(meta: Any) -> JSON | None:
    """Chat usage from ``usageMetadata``: the prompt count includes the cached tokens, and the
    completion counts the thinking tokens Gemini bills as output. None when a count is not
    a number (:func:`provider_counts`)."""
    counts = provider_counts(
        meta,
        "promptTokenCount",
        "thoughtsTokenCount",
        "candidatesTokenCount",
        "cachedContentTokenCount",
    )
    if counts is None:
        return None
    prompt, thoughts, candidates, cached = counts
    completion = candidates + thoughts
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": thoughts},
    }


SIGNATURE_MARK = "__sig_"
"""Joins a tool call's id and the ``thoughtSignature`` Gemini gave its ``functionCall``
(URL-safe base64): the client echoes the id in the next turn's history, where Gemini's
thinking models need the signature back on that call (``gemini_wire`` splits it off)."""


def call_id(base: str, signature: Any) -> str:
    """The canonical tool call id for a ``functionCall`` (its signature folded in)."""
    if not isinstance(signature, str) or not signature:
        return base
    return base + SIGNATURE_MARK + signature.replace("+", "-").replace("/", "_").rstrip("=")


def split_call_id(value: str) -> tuple[str, str | None]:
    """``(id, thoughtSignature or None)`` from an id :func:`call_id` made."""
    base, mark, folded = value.partition(SIGNATURE_MARK)
    if not mark or not folded:
        return value, None
    padded = folded.replace("-", "+").replace("_", "/") + "=" * (-len(folded) % 4)
    return base, padded


def block_reason(data: JSON) -> str | None:
    """Why Gemini refused the prompt itself (``promptFeedback.blockReason``), if it did."""
    feedback = data.get("promptFeedback")
    reason = feedback.get("blockReason") if isinstance(feedback, dict) else None
    return str(reason) if reason else None


def _refusal(reason: str) -> str:
    return f"the upstream's safety filter blocked the prompt ({reason})"


def _split(parts: Any, first_call: int) -> tuple[str, str, list[JSON]]:
    """(answer text, thought text, tool calls numbered from ``first_call``) of ``parts``."""
    text: list[str] = []
    thoughts: list[str] = []
    calls: list[JSON] = []
    for part in parts if isinstance(parts, list) else ():
        if not isinstance(part, dict):
            continue
        call = part.get("functionCall")
        if isinstance(call, dict):
            n = first_call + len(calls)
            base = str(call.get("id") or f"call_{n}")
            calls.append(
                {
                    "id": call_id(base, part.get("thoughtSignature")),
                    "type": "function",
                    "function": {
                        "name": str(call.get("name", "")),
                        "arguments": _encode(call.get("args") or {}).decode(),
                    },
                }
            )
        elif isinstance(part.get("text"), str):
            (thoughts if part.get("thought") else text).append(part["text"])
    return "".join(text), "".join(thoughts), calls


def from_gemini_response(data: JSON, *, model: str) -> JSON:
    """A canonical chat completion from a ``GenerateContentResponse``. A blocked prompt is an
    answer with a ``refusal`` and ``finish_reason: content_filter``."""
    choices: list[JSON] = []
    for i, cand in enumerate(data.get("candidates") or ()):
        content = cand.get("content") if isinstance(cand.get("content"), dict) else {}
        text, thoughts, calls = _split(content.get("parts"), 0)
        message: JSON = {"role": "assistant", "content": text if text or not calls else None}
        if thoughts:
            message["reasoning_content"] = thoughts
        if calls:
            message["tool_calls"] = calls
        finish = finish_reason(cand.get("finishReason"), bool(calls))
        choices.append({"index": cand.get("index", i), "message": message, "finish_reason": finish})
    reason = block_reason(data)
    if not choices and reason:
        message = {"role": "assistant", "content": None, "refusal": _refusal(reason)}
        choices.append({"index": 0, "message": message, "finish_reason": "content_filter"})
    return {
        "id": "chatcmpl-" + str(data.get("responseId") or new_id("")),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(data.get("modelVersion") or model),
        "choices": choices,
        "usage": chat_usage(data.get("usageMetadata")),
    }


class GeminiToChatStream:
    """Turns the stream's ``GenerateContentResponse`` chunks into canonical chat chunks.

    Gemini's stream has no terminator event: it is complete once every candidate it named
    gave a ``finishReason`` (or the prompt was blocked). Only then come the finish chunk and,
    when asked, the usage chunk, so a stream cut before never looks done."""

    __slots__ = ("_calls", "_complete", "_created", "_id", "_include_usage", "_model", "_open")

    def __init__(self, model: str, *, include_usage: bool = True) -> None:
        self._model = model
        self._include_usage = include_usage
        self._id = new_id("chatcmpl-")
        self._created = int(time.time())
        self._complete = False
        self._calls: dict[int, int] = {}  # candidate index -> tool calls sent
        self._open: dict[int, str | None] = {}  # candidate index -> its finish, once given

    @property
    def is_complete(self) -> bool:
        """True once every candidate finished, or the prompt was blocked."""
        return self._complete

    def _chunk(self, choices: list[JSON], usage: JSON | None = None) -> JSON:
        out: JSON = {
            "id": self._id,
            "object": "chat.completion.chunk",
            "created": self._created,
            "model": self._model,
            "choices": choices,
        }
        if usage is not None:
            out["usage"] = usage
        return out

    def feed(self, data: JSON) -> list[JSON]:
        """The chunks one streamed ``GenerateContentResponse`` says."""
        out: list[JSON] = []
        for i, cand in enumerate(data.get("candidates") or ()):
            index = int(cand.get("index", i))
            content = cand.get("content") if isinstance(cand.get("content"), dict) else {}
            sent = self._calls.get(index, 0)
            text, thoughts, calls = _split(content.get("parts"), sent)
            delta: JSON = {}
            if index not in self._open:
                self._open[index] = None
                delta["role"] = "assistant"
            if text:
                delta["content"] = text
            if thoughts:
                delta["reasoning_content"] = thoughts
            if calls:
                delta["tool_calls"] = [{"index": sent + k, **c} for k, c in enumerate(calls)]
                self._calls[index] = sent + len(calls)
            if delta:
                out.append(self._chunk([{"index": index, "delta": delta, "finish_reason": None}]))
            if cand.get("finishReason"):
                self._open[index] = finish_reason(
                    cand["finishReason"], bool(self._calls.get(index))
                )
        reason = block_reason(data)
        if reason and not self._open:
            delta = {"role": "assistant", "refusal": _refusal(reason)}
            out.append(self._chunk([{"index": 0, "delta": delta, "finish_reason": None}]))
            self._open[0] = "content_filter"
        if self._open and all(self._open.values()):
            self._complete = True
            for index, finish in self._open.items():
                out.append(self._chunk([{"index": index, "delta": {}, "finish_reason": finish}]))
            if self._include_usage:
                out.append(self._chunk([], chat_usage(data.get("usageMetadata"))))
        return out
