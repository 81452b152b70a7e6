"""Message content for the opt-in capture, in the GenAI conventions' shapes (no SDK import).

Built from the canonical (OpenAI Chat) request and answer only when an operator opted in
(``telemetry.capture_content`` or ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``).
Each captured value is bounded: text is cut so a value's JSON stays within ``limit``
characters, and the parts and messages past it are dropped. Only message text,
tool calls and tool results are taken; never a header, a key or anything the gateway adds.
"""

from __future__ import annotations

import json
from typing import Any

_SYSTEM_ROLES = frozenset({"system", "developer"})


class _Budget:
    """Characters left for one captured value."""

    __slots__ = ("left",)

    def __init__(self, limit: int) -> None:
        self.left = limit

    def frame(self, message: dict[str, Any]) -> bool:
        """Charge a message's framing (its JSON without parts, a separator); False once
        the budget cannot hold it."""
        self.left -= len(dumps({**message, "parts": []})) + 1
        return self.left > 0

    def take(self, part: dict[str, Any], field: str) -> dict[str, Any] | None:
        """``part`` within the budget (its ``field`` text cut), or None once it is spent."""
        if self.left <= 0:
            return None
        size = len(dumps(part)) + 1  # and its separator
        if size <= self.left:
            self.left -= size
            return part
        text = part.get(field)
        # Escapes make the JSON longer than the text: cut in proportion until it fits.
        while size > self.left and isinstance(text, str) and text:
            text = text[: min(len(text) - 1, len(text) * self.left // size)]
            part = {**part, field: text}
            size = len(dumps(part)) + 1
        fits = size <= self.left
        self.left = 0  # a value cut short ends there
        return part if fits else None
        return part


def _text_parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "content": content}] if content else []
    parts: list[dict[str, Any]] = []
    for item in content if isinstance(content, list) else ():
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            parts.append({"type": "text", "content": item["text"]})
        elif isinstance(item, dict) and isinstance(item.get("type"), str):
            parts.append({"type": item["type"]})  # images, audio, files: the kind, not the data
    return parts


def _tool_calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            parts.append(
                {
                    "type": "tool_call",
                    "id": call.get("id"),
                    "name": fn.get("name"),
                    "arguments": fn.get("arguments"),
                }
            )
    return parts


def _parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    if message.get("role") == "tool":
        text = "".join(p["content"] for p in _text_parts(message.get("content")) if "content" in p)
        return [{"type": "tool_call_response", "id": message.get("tool_call_id"), "response": text}]
    return _text_parts(message.get("content")) + _tool_calls(message)


def _bounded(messages: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    budget = _Budget(limit - 2)  # the list's brackets
    kept: list[dict[str, Any]] = []
    for message in messages:
        if not budget.frame(message):
            break
        parts = []
        for part in message["parts"]:
            field = "response" if part["type"] == "tool_call_response" else "content"
            taken = budget.take(part, field if field in part else "arguments")
            if taken is None:
                break
            parts.append(taken)
        if not parts and budget.left <= 0:
            break
        kept.append({**message, "parts": parts})
    return kept


def input_messages(body: dict[str, Any], limit: int) -> tuple[list[Any], list[Any]]:
    """The request's (system instructions, input messages) in the latest conventions'
    shapes (``gen_ai.system_instructions``, ``gen_ai.input.messages``), each bounded."""
    system: list[dict[str, Any]] = []
    chat: list[dict[str, Any]] = []
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        if message.get("role") in _SYSTEM_ROLES:
            system.extend(_text_parts(message.get("content")))
        else:
            chat.append({"role": message.get("role"), "parts": _parts(message)})
    # The instructions are the bare parts: the one message's framing is not exported.
    instructions = _bounded([{"parts": system}], limit + len('[{"parts":}]'))
    return (instructions[0]["parts"] if instructions else []), _bounded(chat, limit)


def output_messages(choices: list[tuple[str, str | None]], limit: int) -> list[Any]:
    """The answer's choices, ``(text, finish reason)`` each, as ``gen_ai.output.messages``."""
    return _bounded(
        [
            {
                "role": "assistant",
                "parts": _text_parts(text),
                "finish_reason": reason or "",
            }
            for text, reason in choices
        ],
        limit,
    )


def answer_choices(body: dict[str, Any]) -> list[tuple[str, str | None]]:
    """``(text, finish reason)`` of each choice of a whole canonical answer."""
    found: list[tuple[str, str | None]] = []
    for choice in body.get("choices") or ():
        if isinstance(choice, dict):
            message = choice.get("message") or {}
            text = message.get("content") if isinstance(message, dict) else None
            found.append((text if isinstance(text, str) else "", choice.get("finish_reason")))
    return found


def dumps(value: list[Any] | dict[str, Any]) -> str:
    """A captured value as the JSON string the span attribute holds."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
