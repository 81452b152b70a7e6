"""``echo``: the built-in demo upstream. Answers locally, streaming too, with no network.

It answers the way a model would be asked to, so SDK helpers work against the quick start:

- ``tools`` offered and ``tool_choice`` not ``none``: one call of the named tool (a forced
  ``{"type": "function", ...}``), else of the first allowed one, with arguments made up to
  fit its ``parameters`` schema. Under ``auto`` a conversation whose last message is a tool
  result is answered in text instead, so an agent loop ends.
- ``response_format`` ``json_object`` or ``json_schema``: JSON text (a value valid under the
  schema, see ``echo_values``).
- ``n``: that many choices.
- otherwise the last user message back as ``echo: <text>``.
"""

from __future__ import annotations

import array
import base64
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.adapters.base import JSON, Batch, UpstreamTarget
from gateway.adapters.echo_values import example

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

_encode = msgspec.json.Encoder().encode
_MAX_CHOICES = 128  # a demo: a larger n is answered with this many


@dataclass(frozen=True, slots=True)
class _Choice:
    """One answer: its text, or with ``tool`` set a call of that tool whose arguments (JSON)
    are the text."""

    text: str
    tool: str | None = None

    @property
    def finish(self) -> str:
        return "stop" if self.tool is None else "tool_calls"


def _last_user_text(body: JSON) -> str:
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(
                    str(p.get("text", ""))
                    for p in content
                    if isinstance(p, dict) and p.get("type") == "text"
                )
    return ""


def _tool_to_call(body: JSON) -> JSON | None:
    """The function (its ``name``, ``parameters``) the answer calls, or None for text."""
    tools: list[JSON] = [
        t["function"]
        for t in body.get("tools") or ()
        if isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
    ]
    choice = body.get("tool_choice")
    forced = choice == "required"
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        tools, forced = [t for t in tools if t["name"] == name], True
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        allowed = choice.get("allowed_tools") or {}
        names = {_name(t) for t in allowed.get("tools") or ()}
        tools, forced = [t for t in tools if t["name"] in names], allowed.get("mode") == "required"
    if not tools or choice == "none":
        return None
    messages = body.get("messages") or [{}]
    if not forced and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool":
        return None  # the tool answered: say so in text rather than call again
    return tools[0]


def _name(tool: Any) -> Any:
    function = tool.get("function") if isinstance(tool, dict) else None
    return function.get("name") if isinstance(function, dict) else None


def _choices(body: JSON) -> list[_Choice]:
    """The answer's choices, ``n`` of them, all alike."""
    text = f"echo: {_last_user_text(body)}"
    tool = _tool_to_call(body)
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if tool is not None:
        arguments = example(tool.get("parameters") or {"type": "object"}, text)
        choice = _Choice(_encode(arguments).decode(), tool["name"])
    elif kind == "json_schema":
        spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
        schema = spec.get("schema") if isinstance(spec, dict) else None
        choice = _Choice(_encode(example(schema or {}, text)).decode())
    elif kind == "json_object":
        choice = _Choice(_encode({"echo": text}).decode())
    else:
        choice = _Choice(text)
    n = body.get("n")
    count = min(n, _MAX_CHOICES) if isinstance(n, int) and not isinstance(n, bool) else 1
    return [choice] * max(count, 1)


def _usage(body: JSON, choices: list[_Choice]) -> dict[str, Any]:
    prompt = sum(
        len(str(m.get("content", "")).split())
        for m in body.get("messages") or []
        if isinstance(m, dict)
    )
    completion = sum(len(c.text.split()) for c in choices)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _message(choice: _Choice) -> JSON:
    if choice.tool is None:
        return {"role": "assistant", "content": choice.text}
    call = {
        "id": _call_id(),
        "type": "function",
        "function": {"name": choice.tool, "arguments": choice.text},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _pieces(text: str) -> list[str]:
    """``text`` in word-sized pieces that join back to it."""
    return [w if i == 0 else " " + w for i, w in enumerate(text.split(" "))]


def _deltas(choice: _Choice) -> list[JSON]:
    """The deltas of one choice's stream, role first."""
    if choice.tool is None:
        return [
            {"role": "assistant", "content": ""},
            *({"content": p} for p in _pieces(choice.text)),
        ]
    head = {
        "index": 0,
        "id": _call_id(),
        "type": "function",
        "function": {"name": choice.tool, "arguments": ""},
    }
    return [
        {"role": "assistant", "content": None, "tool_calls": [head]},
        *(
            {"tool_calls": [{"index": 0, "function": {"arguments": p}}]}
            for p in _pieces(choice.text)
        ),
    ]


class EchoAdapter:
    """Answers locally: the caller's text echoed, or the tool call / JSON it asked for."""

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """A chat.completion with one choice per ``n``."""
        choices = _choices(body)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": target.upstream_model or str(body.get("model", "echo")),
            "choices": [
                {"index": i, "message": _message(c), "finish_reason": c.finish, "logprobs": None}
                for i, c in enumerate(choices)
            ],
            "usage": _usage(body, choices),
        }

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """The same answer as chunks, one per batch (as a slow upstream would send them):
        per choice its role, one chunk per word, its finish; then usage if asked."""
        choices = _choices(body)
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": target.upstream_model or str(body.get("model", "echo")),
        }
        chunks: list[JSON] = []
        for i, choice in enumerate(choices):
            chunks += [
                {**base, "choices": [{"index": i, "delta": d, "finish_reason": None}]}
                for d in _deltas(choice)
            ]
            chunks.append(
                {**base, "choices": [{"index": i, "delta": {}, "finish_reason": choice.finish}]}
            )
        opts = body.get("stream_options")
        if isinstance(opts, dict) and opts.get("include_usage"):
            chunks.append({**base, "choices": [], "usage": _usage(body, choices)})
        for i, chunk in enumerate(chunks):
            yield Batch([chunk], last=i == len(chunks) - 1)

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """Deterministic 8-dimensional vectors derived from each input's bytes, as floats or
        (``encoding_format: base64``, the openai SDK's default) little-endian float32."""
        inputs = body.get("input")
        items = inputs if isinstance(inputs, list) else [inputs]
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, item in enumerate(items):
            raw = str(item).encode()
            vec = [((sum(raw[j::8]) % 1000) / 1000.0) for j in range(8)]
            embedding: Any = (
                base64.b64encode(array.array("f", vec).tobytes()).decode() if as_base64 else vec
            )
            data.append({"object": "embedding", "index": i, "embedding": embedding})
        tokens = sum(len(str(x).split()) for x in items)
        return {
            "object": "list",
            "data": data,
            "model": target.upstream_model or "echo",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
