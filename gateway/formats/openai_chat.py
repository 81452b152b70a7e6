"""OpenAI Chat Completions, the client surface whose shape is also the canonical form.

Validation here is what every chat-shaped request must pass before routing (with the field
types every client format checks its documented fields by: ``Kind``, ``check_types``); the
answer and the stream pass through with ``model`` set to the id the client asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET

from gateway.formats.media_tokens import MEDIA_BODY, media_sizes
from schemas import InvalidRequestError
from schemas.canonical_markers import START_USAGE
from schemas.keys import fits_int64, shown
from schemas.route_config import ANTHROPIC_THINKING_BUDGETS
from schemas.text_chunk import TextChunk

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from schemas.text_chunk import Chunk

JSON = dict[str, Any]
_encoder = msgspec.json.Encoder()
_encode = _encoder.encode
_encode_into = _encoder.encode_into


@dataclass(frozen=True, slots=True)
class Kind:
    """The JSON type a documented request field must have; ``name`` reads in an error
    ("must be a number"). JSON ``true``/``false`` are never numbers."""

    name: str
    types: tuple[type, ...]

    def accepts(self, value: Any) -> bool:
        """Whether ``value`` (not null) has this type."""
        if isinstance(value, bool):
            return bool in self.types
        return isinstance(value, self.types)


NUMBER = Kind("a number", (int, float))
INTEGER = Kind("an integer", (int,))
BOOLEAN = Kind("a boolean", (bool,))
STRING = Kind("a string", (str,))
OBJECT = Kind("an object", (dict,))
ARRAY = Kind("an array", (list,))
STRING_OR_ARRAY = Kind("a string or an array", (str, list))
STRING_OR_OBJECT = Kind("a string or an object", (str, dict))


def check_types(obj: JSON, kinds: Mapping[str, Kind], path: str = "") -> None:
    """Check each field of ``obj`` (at ``path``; top level when empty) that ``kinds``
    documents; null passes, and so does any field ``kinds`` does not name (providers have
    extensions). Raises InvalidRequestError naming the first mistyped field.

    An integer must fit in 64 bits, as every provider's does: JSON has no bound, and a
    400-digit ``max_tokens`` would otherwise reach the limits' arithmetic and the upstream.

    Cost: one dict lookup per field the client sent (a few, usually).
    """
    for key, value in obj.items():
        kind = kinds.get(key)
        if kind is None or value is None:
            continue
        if not kind.accepts(value):
            param = f"{path}.{key}" if path else key
            raise InvalidRequestError(f"{param}: must be {kind.name}", param=param)
        if type(value) is int and not fits_int64(value):
            param = f"{path}.{key}" if path else key
            raise InvalidRequestError(
                f"{param}: must be {kind.name} that fits in 64 bits, not {shown(value)}",
                param=param,
            )


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# The documented request fields (openai's CompletionCreateParams) and their JSON types; the
# body goes upstream as it is, so a mistyped one is refused here rather than upstream.
_FIELDS = {
    "audio": OBJECT,
    "frequency_penalty": NUMBER,
    "function_call": STRING_OR_OBJECT,
    "functions": ARRAY,
    "logit_bias": OBJECT,
    "logprobs": BOOLEAN,
    "max_completion_tokens": INTEGER,
    "max_tokens": INTEGER,
    "metadata": OBJECT,
    "modalities": ARRAY,
    "moderation": OBJECT,
    "n": INTEGER,
    "parallel_tool_calls": BOOLEAN,
    "prediction": OBJECT,
    "presence_penalty": NUMBER,
    "prompt_cache_key": STRING,
    "prompt_cache_options": OBJECT,
    "prompt_cache_retention": STRING,
    "reasoning_effort": STRING,
    "response_format": OBJECT,
    "safety_identifier": STRING,
    "seed": INTEGER,
    "service_tier": STRING,
    "stop": STRING_OR_ARRAY,
    "store": BOOLEAN,
    "stream": BOOLEAN,
    "stream_options": OBJECT,
    "temperature": NUMBER,
    "thinking": OBJECT,  # not OpenAI's: Claude's, as LiteLLM carries it (and thinking_blocks)
    "tool_choice": STRING_OR_OBJECT,
    "tools": ARRAY,
    "top_logprobs": INTEGER,
    "top_p": NUMBER,
    "user": STRING,
    "verbosity": STRING,
    "web_search_options": OBJECT,
}
_MESSAGE_FIELDS = {
    "content": STRING_OR_ARRAY,
    "name": STRING,
    "thinking_blocks": ARRAY,
    "tool_calls": ARRAY,
    "tool_call_id": STRING,
}
# What the translating adapters (anthropic, gemini, bedrock) read inside those fields: an
# item of another type is refused here, where the caller's path names it, instead of
# failing in an adapter (a 500) or going upstream.
_PART_FIELDS = {"type": STRING, "text": STRING, "image_url": STRING_OR_OBJECT}
_THINKING_FIELDS = {
    "type": STRING,
    "thinking": STRING,
    "signature": STRING,
    "data": STRING,
    "after": INTEGER,
}
_TOOL_CALL_FIELDS = {"id": STRING, "type": STRING, "function": OBJECT}
_CALLED_FIELDS = {"name": STRING, "arguments": STRING}
_TOOL_FIELDS = {"type": STRING, "function": OBJECT}
_FUNCTION_FIELDS = {"name": STRING, "description": STRING, "parameters": OBJECT, "strict": BOOLEAN}
_CHOICE_FIELDS = {"type": STRING, "function": OBJECT, "allowed_tools": OBJECT}
_ALLOWED_FIELDS = {"mode": STRING, "tools": ARRAY}
_NAMED_FIELDS = {"name": STRING}
_FORMAT_FIELDS = {"type": STRING, "json_schema": OBJECT}
_STREAM_OPTIONS_FIELDS = {"include_usage": BOOLEAN, "include_obfuscation": BOOLEAN}
_SCHEMA_FIELDS = {"name": STRING, "description": STRING, "schema": OBJECT, "strict": BOOLEAN}
_DONE_FRAME = b"data: [DONE]\n\n"


def require_object_with_model(body: Any) -> JSON:
    """``body`` as a JSON object. Raises InvalidRequestError unless it is one naming a
    ``model`` (a non-empty string)."""
    if not isinstance(body, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError(
            "'model' is required and must be a non-empty string", param="model"
        )
    return body


def validate_chat_request(raw: Any) -> JSON:
    """Check the fields routing and every adapter rely on. Raises InvalidRequestError."""
    body = require_object_with_model(raw)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError(
            "'messages' is required and must be a non-empty array", param="messages"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidRequestError(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = m.get("role")
        if type(role) is not str or role not in _ROLES:  # an object is no role (nor hashable)
            raise InvalidRequestError(
                f"messages[{i}].role must be one of {', '.join(sorted(_ROLES))}",
                param=f"messages[{i}].role",
            )
        check_types(m, _MESSAGE_FIELDS, f"messages[{i}]")
        if isinstance(content := m.get("content"), list):
            check_items(content, f"messages[{i}].content", _PART_FIELDS)
        if thinking := m.get("thinking_blocks"):
            check_items(thinking, f"messages[{i}].thinking_blocks", _THINKING_FIELDS)
        if tool_calls := m.get("tool_calls"):
            for j, call in check_items(tool_calls, f"messages[{i}].tool_calls", _TOOL_CALL_FIELDS):
                if function := call.get("function"):
                    check_types(function, _CALLED_FIELDS, f"messages[{i}].tool_calls[{j}].function")
    check_types(body, _FIELDS)
    if tools := body.get("tools"):
        for i, tool in check_items(tools, "tools", _TOOL_FIELDS):
            if function := tool.get("function"):
                check_types(function, _FUNCTION_FIELDS, f"tools[{i}].function")
    if isinstance(choice := body.get("tool_choice"), dict):
        _check_tool_choice(choice)
    if isinstance(options := body.get("stream_options"), dict):
        check_types(options, _STREAM_OPTIONS_FIELDS, "stream_options")
    if isinstance(fmt := body.get("response_format"), dict):
        check_types(fmt, _FORMAT_FIELDS, "response_format")
        if schema := fmt.get("json_schema"):
            check_types(schema, _SCHEMA_FIELDS, "response_format.json_schema")
    return body


def check_items(items: list[Any], path: str, kinds: Mapping[str, Kind]) -> list[tuple[int, JSON]]:
    """``items`` (at ``path``) as ``(index, object)`` pairs, each object's fields checked by
    ``kinds`` (:func:`check_types`). Raises InvalidRequestError naming the first item that is
    not an object, or its first mistyped field."""
    checked = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidRequestError(f"{path}[{i}]: must be an object", param=f"{path}[{i}]")
        check_types(item, kinds, f"{path}[{i}]")
        checked.append((i, item))
    return checked


def _check_tool_choice(choice: JSON) -> None:
    check_types(choice, _CHOICE_FIELDS, "tool_choice")
    if function := choice.get("function"):
        check_types(function, _NAMED_FIELDS, "tool_choice.function")
    if allowed := choice.get("allowed_tools"):
        check_types(allowed, _ALLOWED_FIELDS, "tool_choice.allowed_tools")
        for i, tool in check_items(
            allowed.get("tools") or [], "tool_choice.allowed_tools.tools", _TOOL_FIELDS
        ):
            if function := tool.get("function"):
                check_types(
                    function, _NAMED_FIELDS, f"tool_choice.allowed_tools.tools[{i}].function"
                )


_LARGEST_CAP = 1 << 31


def input_modalities(body: JSON) -> tuple[str, ...]:
    """Non-text modalities the request carries (``image``, ``audio``, ``file``), sorted."""
    found: set[str] = set()
    for m in body.get("messages", ()):
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "image_url":
                    found.add("image")
                elif kind == "input_audio":
                    found.add("audio")
                elif kind == "file":
                    found.add("file")
    return tuple(sorted(found))


def route_needs(body: JSON) -> tuple[tuple[str, ...], int | None, int]:
    """What a route must take of a canonical request: its :func:`input_modalities`, its
    :func:`output_cap` and, without one, its :func:`thinking_budget` (one call on the request
    path)."""
    cap = output_cap(body)
    return input_modalities(body), cap, thinking_budget(body) if cap is None else 0


def thinking_budget(body: JSON) -> int:
    """The thinking budget a canonical request asks of a Claude route (its ``thinking``'s
    ``budget_tokens``, else its ``reasoning_effort``'s), which such a route is sent on top of
    its default ``max_tokens`` when the request sets none; 0: none."""
    thinking = body.get("thinking")
    if isinstance(thinking, dict):
        budget = thinking.get("budget_tokens")
        if thinking.get("type") == "disabled" or type(budget) is not int or budget <= 0:
            return 0
        return min(budget, _LARGEST_CAP)
    effort = body.get("reasoning_effort")
    return ANTHROPIC_THINKING_BUDGETS.get(effort, 0) if isinstance(effort, str) else 0


def output_cap(body: JSON) -> int | None:
    """The most output tokens a canonical request allows over all its choices: its
    ``max_completion_tokens`` or ``max_tokens`` times its ``n`` (what OpenAI and Anthropic
    reserve of a token limit while it runs); None when it sets no cap."""
    asked = body.get("max_completion_tokens") or body.get("max_tokens")
    if type(asked) is not int or asked <= 0:
        return None
    n = body.get("n")
    # No model answers more; a larger number (up to 2**63 passes validation) would only blur
    # the sums a token pace keeps.
    return min(asked * n if type(n) is int and n > 1 else asked, _LARGEST_CAP)


def estimate_prompt_tokens(raw_body_len: int, body: Any = None) -> int:
    """A cheap prompt-size estimate from the body length (about 4 bytes per token), each
    base64 image or PDF in ``body`` (the decoded request, walked only when it is large)
    counted as ``media_tokens`` says."""
    tokens = raw_body_len // 4
    if body is None or raw_body_len < MEDIA_BODY:
        return tokens
    for size, estimate in media_sizes(body):
        tokens -= max(0, size // 4 - estimate)
    return tokens


def prompt_estimate(raw: bytes, body: Any) -> int:
    """:func:`estimate_prompt_tokens` of a request sent as ``raw`` and decoded as ``body``,
    which is walked only when ``raw`` is large and says ``base64``."""
    images = len(raw) >= MEDIA_BODY and raw.find(b"base64") >= 0  # not `in`: see sse.py
    return estimate_prompt_tokens(len(raw), body if images else None)


def render_response(chat: JSON, model: str, request: JSON | None = None) -> bytes:
    """The answer as the client receives it: unchanged but for ``model`` (``request``, the
    client's body, is the ``Surface.render`` signature's: a chat answer echoes none of it)."""
    chat["model"] = model
    return _encode(chat)


class ChatStream:
    """Renders canonical chunks as OpenAI SSE frames; ends with ``[DONE]`` or an error frame."""

    media_type = b"text/event-stream"

    def __init__(self, model: str, *, usage: bool = True) -> None:
        self._model = model
        self._usage = usage
        self._first = True

    def feed(self, chunk: Chunk) -> list[bytes]:
        """One ``data:`` frame for ``chunk`` (none for a usage chunk the client did not ask
        for: see :func:`asking_usage`); the first one without its :data:`START_USAGE`."""
        out = bytearray()
        self._into(out, chunk)
        return [bytes(out)] if out else []

    def feed_all(self, chunks: Iterable[Chunk], out: bytearray) -> None:
        """Append what :meth:`feed` gives each of ``chunks`` to ``out``, every frame encoded
        into it (a stream's relay writes a batch's frames at once). A chunk that raises
        leaves the frames of those before it."""
        for chunk in chunks:
            start = len(out)
            try:
                self._into(out, chunk)
            except BaseException:
                del out[start:]  # no half frame
                raise

    def _into(self, out: bytearray, chunk: Chunk) -> None:
        if type(chunk) is TextChunk:  # text: no usage of its own, no START_USAGE
            self._first = False
            chunk.model = self._model
            if not self._usage and chunk.usage is None:
                if not chunk.choices:
                    return
                chunk.usage = UNSET
        else:
            chunk["model"] = self._model
            if self._first:  # only a stream's first chunk carries it
                self._first = False
                chunk.pop(START_USAGE, None)
            if not self._usage and "usage" in chunk:
                if not chunk.get("choices"):
                    return
                if chunk["usage"] is None:  # every chunk's, once asked: read by nothing after
                    del chunk["usage"]
                else:  # a provider's usage on a content chunk: the attempt may still read it
                    chunk = {k: v for k, v in chunk.items() if k != "usage"}
        out += b"data: "
        _encode_into(chunk, out, -1)
        out += b"\n\n"

    def finish(self) -> list[bytes]:
        """The clean end of the stream."""
        return [_DONE_FRAME]

    def error(
        self, message: str, kind: str = "upstream_error", *, status: int | None = None
    ) -> list[bytes]:
        """An in-band error frame for a stream cut mid-answer; no ``[DONE]`` follows. (Its
        ``type`` is always ``server_error``, whatever ``status`` the failure stands for.)"""
        body = {"error": {"message": message, "type": "server_error", "param": None, "code": kind}}
        return [b"data: " + _encode(body) + b"\n\n"]


def wants_usage(request: JSON) -> bool:
    """Whether a streamed chat request asked for the usage chunk itself."""
    options = request.get("stream_options")
    return isinstance(options, dict) and options.get("include_usage") is True


def asking_usage(body: JSON) -> JSON:
    """``body`` as sent upstream: a stream asks for its usage chunk whatever the client asked
    (``stream_options.include_usage``), so that what it used is billed as the upstream
    reported it rather than estimated; :class:`ChatStream` drops that chunk again for a
    client that did not ask. Other bodies are returned as they are."""
    if body.get("stream") is not True or wants_usage(body):
        return body
    options = body.get("stream_options")
    return {**body, "stream_options": {**(options or {}), "include_usage": True}}


def upstream_request(raw: Any) -> JSON:
    """The chat surface's request as sent upstream: validated (:func:`validate_chat_request`)
    and asking for usage (:func:`asking_usage`). Raises InvalidRequestError."""
    return asking_usage(validate_chat_request(raw))


def error_body(status: int, message: str, *, code: str, param: str | None = None) -> bytes:
    """OpenAI-shaped ``{"error": {"message", "type", "param", "code"}}``."""
    return _encode(
        {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}
    )


def error_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status."""
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error" if status == 500 else "api_error"
    return "invalid_request_error"


def content_chars(body: JSON) -> int:
    """Characters of a chat answer's content and tool arguments or inputs (what the estimate prices
    when the upstream reports no usage)."""
    total = 0
    for choice in body.get("choices") or ():
        message = choice.get("message") or {} if isinstance(choice, dict) else {}
        content = message.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += parts_chars(content)
        for call in message.get("tool_calls") or ():
            total += _call_chars(call)
    return total


def delta_chars(delta: JSON) -> int:
    """Characters of one streamed choice's ``delta``: its content and tool arguments, as
    :func:`content_chars` counts a whole answer's."""
    total = 0
    content = delta.get("content")
    if content:  # a string, or (some providers) a list of parts
        total += len(content) if type(content) is str else parts_chars(content)
    for call in delta.get("tool_calls") or ():
        total += _call_chars(call)
    return total


def _call_chars(call: Any) -> int:
    """Characters of a tool call's arguments, or of a custom (freeform) tool call's input."""
    if not isinstance(call, dict):
        return 0
    function = call.get("function")
    if function is not None:
        text = function.get("arguments") if isinstance(function, dict) else None
    else:
        custom = call.get("custom")
        text = custom.get("input") if isinstance(custom, dict) else None
    return len(text) if isinstance(text, str) else 0


def parts_chars(parts: list[Any]) -> int:
    """Characters of the text in a content given as parts (some providers' answers)."""
    return sum(
        len(text)
        for part in parts
        if isinstance(part, dict) and isinstance(text := part.get("text"), str)
    )
