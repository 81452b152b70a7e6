"""ConverseStream events -> canonical ``chat.completion.chunk`` dicts (pure).

Fed one decoded event at a time (``:event-type`` and its JSON payload), in order. The role
rides on the first chunk that carries content, so a stream that fails before producing
anything yields no chunk at all (and may still fall back). ``messageStop`` says why the
answer ended and ``metadata`` (which follows it) carries usage: the finish chunk comes with
``metadata``, or at :meth:`ConverseToChatStream.finish` when the body ends after
``messageStop`` without it. A stream that ends before ``messageStop`` never looks done.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.adapters._anthropic_to_canonical import new_id
from gateway.adapters.bedrock_wire import JSON, chat_usage, finish_reason


class ConverseToChatStream:
    """Translates one ConverseStream answer; ``is_complete`` once nothing more may follow."""

    def __init__(self, model: str, *, include_usage: bool) -> None:
        self._id = new_id("chatcmpl-")
        self._created = int(time.time())
        self._model = model
        self._include_usage = include_usage
        self._role_sent = False
        self._tools: dict[int, int] = {}  # contentBlockIndex -> tool_calls index
        self._stop: str | None = None
        self.is_complete = False

    def feed(self, event: str, payload: JSON) -> list[JSON]:
        """The chunks ``event`` yields (often none)."""
        if event == "contentBlockDelta":
            return self._delta(payload)
        if event == "contentBlockStart":
            start = payload.get("start")
            use = start.get("toolUse") if isinstance(start, dict) else None
            if isinstance(use, dict):
                index = self._tools.setdefault(_index(payload), len(self._tools))
                call = {
                    "index": index,
                    "id": use.get("toolUseId"),
                    "type": "function",
                    "function": {"name": use.get("name"), "arguments": ""},
                }
                return [self._chunk({"tool_calls": [call]})]
            return []
        if event == "messageStop":
            stop = payload.get("stopReason")
            self._stop = stop if isinstance(stop, str) else "end_turn"
            return []
        if event == "metadata":
            return self._end(payload.get("usage"))
        return []  # messageStart, contentBlockStop, and events this gateway does not use

    def finish(self) -> list[JSON]:
        """The closing chunks when the body ended after ``messageStop`` without
        ``metadata``; None-equivalent (empty, not complete) when it ended before."""
        if self._stop is None or self.is_complete:
            return []
        return self._end(None)

    def _delta(self, payload: JSON) -> list[JSON]:
        delta = payload.get("delta")
        if not isinstance(delta, dict):
            return []
        if isinstance(delta.get("text"), str):
            return [self._chunk({"content": delta["text"]})] if delta["text"] else []
        use = delta.get("toolUse")
        if isinstance(use, dict) and isinstance(use.get("input"), str):
            index = self._tools.setdefault(_index(payload), len(self._tools))
            call = {"index": index, "function": {"arguments": use["input"]}}
            return [self._chunk({"tool_calls": [call]})]
        reasoning = delta.get("reasoningContent")
        if isinstance(reasoning, dict) and isinstance(reasoning.get("text"), str):
            return [self._chunk({"reasoning_content": reasoning["text"]})]
        return []

    def _end(self, usage: Any) -> list[JSON]:
        self.is_complete = True
        out = [self._chunk({}, finish_reason(self._stop))]
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
    index = payload.get("contentBlockIndex")
    return index if isinstance(index, int) else 0
