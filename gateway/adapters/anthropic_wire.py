"""Upstream kind ``anthropic``: canonical chat <-> the native Anthropic Messages wire (pure).

Requests: :func:`to_messages_request`. Answers and streams: :func:`from_messages_response`,
:class:`MessagesToChatStream` (in ``_anthropic_to_canonical``, re-exported here).

Dropped, because Anthropic has no equivalent and leaving them out changes no answer's
validity: ``frequency_penalty``, ``presence_penalty``, ``seed``, ``store``, ``metadata``,
``service_tier``, ``prediction``, ``verbosity``, ``prompt_cache_*``, ``stream_options``,
message ``name``s, and ``thinking_blocks`` entries Anthropic would
refuse: a ``thinking`` block with no signature (the Messages surface renders another
provider's reasoning so) and blocks of other types. System (and developer) messages anywhere
in the conversation are hoisted into ``system``, in order. Prompt-caching ``cache_control``
marks go on where LiteLLM carries them on chat: a content part's (of any message, the system's
included) on its block, a tool message's last marked part's on its ``tool_result``, a tool's and
the request's as they are. Claude's own ``thinking`` config
goes as it is, and an assistant message's signed ``thinking_blocks`` (LiteLLM's field: what
the Messages surface and ``from_messages_response`` put there) go back unchanged, first in
that turn, as Anthropic requires when thinking is on, but for a block whose ``after`` says
Claude's interleaved thinking gave it after the turn's text or tool calls (it goes back
there); a turn sent as two assistant messages has the second one's leading thinking moved
up to the turn's. Without a ``thinking`` config, a ``reasoning_effort`` becomes one
(:data:`THINKING_BUDGETS`, LiteLLM's budgets): ``none`` disables thinking, the others enable
it with that many tokens, and an unknown effort is dropped. Anthropic wants ``max_tokens``
above the budget: a request that set none gets the budget on top of
:data:`DEFAULT_MAX_TOKENS`; one whose own is not above it, whose sampling Claude refuses
while thinking, or whose last assistant turn calls a tool without Claude's signed thinking
(Claude refuses that tool loop while it thinks), is sent without thinking, as before efforts
were mapped. Refused
(InvalidRequestError), because the answer would silently differ from what was asked: ``n`` >
1, ``logprobs``, ``top_logprobs``, ``logit_bias``, ``temperature`` > 1 (Anthropic's range is
0-1), audio, ``web_search_options``, legacy ``functions``/``function_call``, custom
(non-function) tools, ``response_format`` ``json_object`` (Anthropic has no schema-less JSON
mode), images that are not jpeg/png/gif/webp, files that are not base64 PDFs, tool-call
arguments that are not a JSON object, and, while a ``thinking`` config turns thinking on,
what Claude refuses then: ``temperature`` other than 1, ``top_p`` below 0.95, a
``tool_choice`` forcing a call (refused here in the caller's terms, not changed unasked nor
sent to fail upstream). What a Messages client asks only of Claude (``_claude_native``)
goes as it asked: ``top_k``, ``context_management`` (beta), and ``is_error`` on its failed
tool results (without the ``Error: `` prefix other routes get); its presence also keeps
Claude's ``stop_reason`` on the answer's choice (``_claude_stop_reason``) for the Messages renderer.
"""

from __future__ import annotations

from typing import Any

from gateway.adapters._anthropic_to_canonical import (
    JSON,
    MessagesToChatStream,
    UpstreamStreamError,
    chat_usage,
    from_messages_response,
)
from gateway.adapters.chat_message import (
    answered_call,
    interleave,
    join_turn,
    refuse_sampling_with_thinking,
    sampling_conflict,
    signed_thinking,
    text_of,
    tool_calls,
    unsigned_tool_turn,
)
from schemas import InvalidRequestError
from schemas.canonical_markers import CLAUDE_NATIVE as _CLAUDE_NATIVE
from schemas.canonical_markers import TOOL_ERROR_PREFIX as _TOOL_ERROR_PREFIX
from schemas.route_config import ANTHROPIC_DEFAULT_MAX_TOKENS, ANTHROPIC_THINKING_BUDGETS

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "THINKING_BUDGETS",
    "MessagesToChatStream",
    "UpstreamStreamError",
    "chat_usage",
    "claude_thinking",
    "from_messages_response",
    "thinking_for_effort",
    "to_messages_request",
]

DEFAULT_MAX_TOKENS = ANTHROPIC_DEFAULT_MAX_TOKENS
THINKING_BUDGETS = ANTHROPIC_THINKING_BUDGETS
"""The ``budget_tokens`` a chat ``reasoning_effort`` thinks with on an anthropic route (1024,
Anthropic's least, for ``minimal`` too)."""
_IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_REFUSED = {
    "logprobs": "logprobs: not available from anthropic upstreams",
    "top_logprobs": "top_logprobs: not available from anthropic upstreams",
    "logit_bias": "logit_bias: not supported by anthropic upstreams",
    "audio": "audio: audio output is not supported by anthropic upstreams",
    "web_search_options": "web_search_options: not supported by anthropic upstreams",
    "functions": "functions: the legacy functions API is not supported; use tools",
    "function_call": "function_call: the legacy functions API is not supported; use tool_choice",
}
_TOOL_CHOICE = {"auto": "auto", "required": "any", "none": "none"}
_THINKING_TYPES = frozenset({"thinking", "redacted_thinking"})


def to_messages_request(chat: JSON, *, upstream_model: str) -> JSON:
    """Translate a canonical chat request into an Anthropic Messages request.

    Raises InvalidRequestError (``param`` names the field) for anything an Anthropic
    upstream cannot honour as asked.
    """
    for key, message in _REFUSED.items():
        if chat.get(key):
            raise InvalidRequestError(message, param=key)
    if chat.get("n") not in (None, 1):
        raise InvalidRequestError("n: anthropic upstreams return exactly one choice", param="n")
    max_tokens = chat.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = chat.get("max_tokens")
    thinking = claude_thinking(chat, max_tokens)
    if max_tokens is None:
        budget = (thinking or {}).get("budget_tokens")
        max_tokens = DEFAULT_MAX_TOKENS + (budget if type(budget) is int and budget > 0 else 0)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidRequestError("max_tokens: must be an integer >= 1", param="max_tokens")
    messages = chat.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages: a non-empty array is required", param="messages")
    native = chat.get(_CLAUDE_NATIVE)
    native = native if type(native) is dict else {}
    system, converted = _convert_messages(messages, frozenset(native.get("tool_errors") or ()))
    req: JSON = {"model": upstream_model, "max_tokens": max_tokens, "messages": converted}
    if system is not None:
        req["system"] = system
    if isinstance(chat.get("cache_control"), dict):
        req["cache_control"] = chat["cache_control"]
    stop = chat.get("stop")
    if isinstance(stop, str):
        req["stop_sequences"] = [stop]
    elif isinstance(stop, list) and stop:
        req["stop_sequences"] = stop
    temperature = chat.get("temperature")
    if temperature is not None:
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not 0 <= temperature <= 1
        ):
            raise InvalidRequestError(
                "temperature: anthropic upstreams accept 0 to 1", param="temperature"
            )
        req["temperature"] = temperature
    if chat.get("top_p") is not None:
        req["top_p"] = chat["top_p"]
    if native.get("top_k") is not None:
        req["top_k"] = native["top_k"]
    if native.get("context_management") is not None:
        req["context_management"] = native["context_management"]
    if chat.get("tools"):
        _convert_tools(chat, req)
    _convert_response_format(chat.get("response_format"), req)
    user = chat.get("user") or chat.get("safety_identifier")
    if isinstance(user, str) and user:
        req["metadata"] = {"user_id": user}
    if thinking is not None:
        req["thinking"] = thinking
    if chat.get("stream"):
        req["stream"] = True
    return req


def claude_thinking(chat: JSON, max_tokens: Any) -> JSON | None:
    """The thinking config Claude is sent for ``chat`` (None: none): its own ``thinking``, or
    its effort's (:func:`thinking_for_effort`). Raises InvalidRequestError for sampling
    Claude refuses while thinking. A config that turns thinking on is not sent while the
    last assistant turn calls a tool without Claude's signed thinking: Claude refuses that
    tool loop (its turn must begin with its thinking), and such a turn came from another
    route of the model (Gemini's, an OpenAI model's) or a client that kept no thinking, so
    the refusal would end the conversation on this route; LiteLLM drops it so too."""
    thinking = chat.get("thinking")
    if not isinstance(thinking, dict):
        return thinking_for_effort(chat, max_tokens)
    if thinking.get("type") != "disabled" and unsigned_tool_turn(chat):
        return None
    refuse_sampling_with_thinking(chat, thinking, "thinking")
    return thinking


def thinking_for_effort(chat: JSON, max_tokens: Any) -> JSON | None:
    """The thinking config ``chat``'s ``reasoning_effort`` asks of Claude (None: none to send).
    An effort Claude cannot think with as asked (``max_tokens`` not above its budget,
    sampling it refuses while thinking, or a tool loop whose last assistant turn came back
    without Claude's signed thinking, as most chat clients send it) sends none, as before
    efforts were mapped: the chat dialect's hint is not worth a refusal no other provider's
    route would give."""
    effort = chat.get("reasoning_effort")
    if effort == "none":
        return {"type": "disabled"}
    budget = THINKING_BUDGETS.get(effort) if isinstance(effort, str) else None
    if budget is None:
        return None
    if type(max_tokens) is int and max_tokens <= budget:
        return None
    if sampling_conflict(chat, "reasoning_effort") is not None or unsigned_tool_turn(chat):
        return None
    return {"type": "enabled", "budget_tokens": budget}


def _append(out: list[JSON], role: str, blocks: list[JSON]) -> None:
    # Merging keeps roles alternating, and puts every tool_result of one assistant turn
    # into the single user turn that must follow it.
    if not out or out[-1]["role"] != role:
        out.append({"role": role, "content": blocks})
        return
    if role == "assistant":
        join_turn(out[-1]["content"], blocks, _is_thinking)
    else:
        out[-1]["content"].extend(blocks)


def _is_thinking(block: JSON) -> bool:
    return block["type"] in _THINKING_TYPES


def _mark(block: JSON, part: Any) -> JSON:
    """``block`` with chat ``part``'s ``cache_control`` mark, when it has one."""
    if type(part) is dict and type(part.get("cache_control")) is dict:
        block["cache_control"] = part["cache_control"]
    return block


def _last_mark(block: JSON, content: Any) -> JSON:
    """``block`` with the mark of the last marked part of ``content``, if any."""
    for part in content if type(content) is list else ():
        _mark(block, part)
    return block


def _system_blocks(content: Any, path: str) -> list[JSON]:
    """A system message's text blocks: one, or one per part when a part is marked."""
    if type(content) is list and any(type(p) is dict and "cache_control" in p for p in content):
        text_of(content, path)  # the same refusal of a part that is not text
        return [_mark({"type": "text", "text": p["text"]}, p) for p in content if p.get("text")]
    text = text_of(content, path)
    return [{"type": "text", "text": text}] if text else []


def _convert_messages(
    messages: list[Any], tool_errors: frozenset[str]
) -> tuple[str | list[JSON] | None, list[JSON]]:
    system: list[JSON] = []
    out: list[JSON] = []
    for i, msg in enumerate(messages):
        path = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise InvalidRequestError(f"{path}: must be an object", param=path)
        role = msg.get("role")
        if role in ("system", "developer"):
            system.extend(_system_blocks(msg.get("content"), path))
        elif role == "user":
            blocks = _user_blocks(msg.get("content"), path)
            if blocks:
                _append(out, "user", blocks)
        elif role == "assistant":
            blocks = _assistant_blocks(msg, path)
            if blocks:
                _append(out, "assistant", blocks)
        elif role == "tool":
            _append(out, "user", [_tool_result(msg, path, tool_errors)])
        else:
            raise InvalidRequestError(
                f"{path}.role: '{role}' is not supported by anthropic upstreams",
                param=f"{path}.role",
            )
    if not system:
        return None, out
    if len(system) == 1 and "cache_control" not in system[0]:
        return system[0]["text"], out
    return system, out


def _user_blocks(content: Any, path: str) -> list[JSON]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise InvalidRequestError(
            f"{path}.content: must be a string or an array", param=f"{path}.content"
        )
    blocks = []
    for j, part in enumerate(content):
        ppath = f"{path}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if part.get("text"):
                blocks.append(_mark({"type": "text", "text": part["text"]}, part))
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            blocks.append(_mark(_image_block(url, f"{ppath}.image_url.url"), part))
        elif kind == "file":
            blocks.append(_mark(_document_block(part.get("file"), f"{ppath}.file"), part))
        else:
            raise InvalidRequestError(
                f"{ppath}.type: '{kind}' parts are not supported by anthropic upstreams",
                param=f"{ppath}.type",
            )
    return blocks


def _split_data_url(url: str, path: str) -> tuple[str, str]:
    header, comma, data = url[5:].partition(",")
    media_type, _, encoding = header.partition(";")
    if not comma or encoding != "base64":
        raise InvalidRequestError(f"{path}: data URLs must be base64", param=path)
    return media_type, data


def _image_block(url: Any, path: str) -> JSON:
    if not isinstance(url, str):
        raise InvalidRequestError(f"{path}: must be a string", param=path)
    if url.startswith("data:"):
        media_type, data = _split_data_url(url, path)
        if media_type not in _IMAGE_TYPES:
            raise InvalidRequestError(
                f"{path}: '{media_type}' images are not supported by "
                "anthropic upstreams (jpeg, png, gif, webp)",
                param=path,
            )
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }
    if url.startswith(("https://", "http://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise InvalidRequestError(f"{path}: must be a data: or http(s) URL", param=path)


def _document_block(file: Any, path: str) -> JSON:
    data_url = file.get("file_data") if isinstance(file, dict) else None
    if not isinstance(data_url, str) or not data_url.startswith("data:"):
        raise InvalidRequestError(
            f"{path}.file_data: anthropic upstreams need the file inline as a base64 data URL",
            param=f"{path}.file_data",
        )
    media_type, data = _split_data_url(data_url, f"{path}.file_data")
    if media_type != "application/pdf":
        raise InvalidRequestError(
            f"{path}.file_data: only PDF files are supported by anthropic upstreams",
            param=f"{path}.file_data",
        )
    block: JSON = {
        "type": "document",
        "source": {"type": "base64", "media_type": media_type, "data": data},
    }
    if isinstance(file.get("filename"), str):
        block["title"] = file["filename"]
    return block


def _assistant_blocks(msg: JSON, path: str) -> list[JSON]:
    text = text_of(msg.get("content"), path)
    blocks: list[JSON] = (
        [_last_mark({"type": "text", "text": text}, msg.get("content"))] if text else []
    )
    for call_id, name, arguments in tool_calls(msg, path):
        blocks.append({"type": "tool_use", "id": call_id, "name": name, "input": arguments})
    return interleave(signed_thinking(msg.get("thinking_blocks"), _thinking, _redacted), blocks)


def _thinking(text: str, signature: str) -> JSON:
    return {"type": "thinking", "thinking": text, "signature": signature}


def _redacted(data: str) -> JSON:
    return {"type": "redacted_thinking", "data": data}


def _tool_result(msg: JSON, path: str, tool_errors: frozenset[str]) -> JSON:
    """A tool message's ``tool_result``; an error (its id in ``tool_errors``, a Messages
    client's ``is_error``) said as Claude reads it, not by the prefix other routes get."""
    block: JSON = {"type": "tool_result", "tool_use_id": answered_call(msg, path)}
    _last_mark(block, msg.get("content"))
    text = text_of(msg.get("content"), path)
    if block["tool_use_id"] in tool_errors:
        block["is_error"] = True
        text = text.removeprefix(_TOOL_ERROR_PREFIX)
    if text:
        block["content"] = text
    return block


def _convert_tools(chat: JSON, req: JSON) -> None:
    tools: dict[str, JSON] = {}
    for i, tool in enumerate(chat["tools"]):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function":
            raise InvalidRequestError(
                f"tools[{i}].type: only function tools are supported by anthropic upstreams",
                param=f"tools[{i}].type",
            )
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(
                f"tools[{i}].function.name: required", param=f"tools[{i}].function.name"
            )
        out: JSON = {
            "name": name,
            "input_schema": function.get("parameters") or {"type": "object", "properties": {}},
        }
        if function.get("description"):
            out["description"] = function["description"]
        if function.get("strict") is True:
            out["strict"] = True
        tools[name] = _mark(out, tool)
    choice = chat.get("tool_choice")
    converted: JSON | None = None
    if isinstance(choice, str) and choice in _TOOL_CHOICE:
        converted = {"type": _TOOL_CHOICE[choice]}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if not isinstance(name, str):
            raise InvalidRequestError(
                "tool_choice.function.name: required", param="tool_choice.function.name"
            )
        converted = {"type": "tool", "name": name}
    elif isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        allowed = choice.get("allowed_tools") or {}
        names = {(t.get("function") or {}).get("name") for t in allowed.get("tools") or ()}
        # Anthropic has no allow-list: offering only the allowed tools is the same constraint.
        tools = {name: tool for name, tool in tools.items() if name in names}
        converted = {"type": "any" if allowed.get("mode") == "required" else "auto"}
    elif choice is not None:
        raise InvalidRequestError(
            "tool_choice: not supported by anthropic upstreams", param="tool_choice"
        )
    if chat.get("parallel_tool_calls") is False and (converted or {}).get("type") != "none":
        converted = converted or {"type": "auto"}
        converted["disable_parallel_tool_use"] = True
    req["tools"] = list(tools.values())
    if converted is not None:
        req["tool_choice"] = converted


def _convert_response_format(fmt: Any, req: JSON) -> None:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind is None or kind == "text":
        return
    if kind == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema")
        if isinstance(schema, dict):
            req["output_config"] = {"format": {"type": "json_schema", "schema": schema}}
            return
    raise InvalidRequestError(
        f"response_format: '{kind}' cannot be honoured by anthropic "
        "upstreams (use json_schema with a schema)",
        param="response_format",
    )
