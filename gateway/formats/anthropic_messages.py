"""Anthropic Messages client surface (``POST /v1/messages``) <-> the canonical chat shape.

Requests: :func:`to_chat_request`. Answers, streams and errors: :func:`from_chat_response`,
:class:`ChatToMessagesStream` (in ``_canonical_to_anthropic``), :func:`error_body` (in
``_anthropic_errors``), re-exported.

Claude's thinking is carried as LiteLLM carries it on chat: the ``thinking`` config as the
canonical ``thinking``, and an assistant turn's thinking and redacted_thinking blocks (signed,
as Claude gave them) in its ``thinking_blocks``, in order. An ``anthropic`` route sends both
on unchanged (but for a thinking block without a signature, another provider's reasoning as
this gateway rendered it, which Claude would refuse); every other upstream kind drops them
(the config marked as Claude's: :data:`CLAUDE_THINKING`).

Prompt-caching ``cache_control`` marks (on the request, system and text blocks, images, tool
results and tools) are kept where LiteLLM keeps them on chat: on the content part, the tool,
the request; an ``anthropic`` route sends them on (Claude caches only what is marked), and the
request is marked (:data:`CLAUDE_CACHE`) so an ``openai_compat`` route drops them.
``top_k``, ``context_management`` (beta) and a ``tool_result``'s ``is_error`` (also an
``Error: `` prefix on the chat tool message) ride in :data:`CLAUDE_NATIVE`, which also keeps
Claude's own ``stop_reason`` for the answer: only a Claude route reads it, and every other
route drops them (``context_management`` too: Claude Code sends it with every request, and a
refusal would make whether a request is answered depend on the route a draw or a failover
picks; without it the route answers over the whole context).
Dropped, because chat has no equivalent and leaving them out changes no answer's validity:
``service_tier``, ``speed``, ``inference_geo``,
``diagnostics``, ``output_config.effort``, citations on text blocks. Refused
(InvalidRequestError), because ignoring them would answer a different question: server tools
(``web_search_*``, ``bash_*``, ``code_execution_*``...), ``container``, ``mcp_servers``
(the MCP connector: Claude calls those tools itself), ``search_result``
blocks, file-id image and document sources, URL documents, and any block type this module
does not know. Images and documents become chat parts (``_messages_media``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.formats._anthropic_errors import error_body
from gateway.formats._canonical_to_anthropic import ChatToMessagesStream, from_chat_response
from gateway.formats._common import (
    JSON,
    append_system,
    json_text,
    want_dict,
    want_list,
    want_number,
    want_positive_int,
    want_str,
)
from gateway.formats._messages_media import document_part, image_part
from gateway.formats.claude_markers import (
    ANTHROPIC_BETA,
    CLAUDE_CACHE,
    CLAUDE_NATIVE,
    CLAUDE_THINKING,
    TOOL_ERROR_PREFIX,
    claude_native,
)
from gateway.formats.openai_chat import (
    ARRAY,
    BOOLEAN,
    INTEGER,
    NUMBER,
    OBJECT,
    STRING,
    STRING_OR_ARRAY,
    STRING_OR_OBJECT,
    check_types,
)
from schemas import InvalidRequestError

if TYPE_CHECKING:
    from gateway.formats.client_paths import Origins

__all__ = [
    "ANTHROPIC_BETA",
    "CLAUDE_CACHE",
    "CLAUDE_THINKING",
    "ChatToMessagesStream",
    "error_body",
    "from_chat_response",
    "to_chat_request",
]

# Blocks of one system prompt or one tool result become one chat string; a blank line keeps
# their boundary visible to the model.
_JOIN = "\n\n"
_REFUSED_TOP_LEVEL = ("container", "mcp_servers")  # empty: none asked for
_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}
_TOOL_CHOICE_TYPES = frozenset({*_TOOL_CHOICE, "tool"})
_MEDIA = {"image": image_part, "document": document_part}  # blocks that become chat parts
# The documented request fields (anthropic's MessageCreateParams, with the sampling ones
# older API versions take) and their JSON types, also those this module drops.
_FIELDS = {
    "cache_control": OBJECT,
    "container": STRING_OR_OBJECT,
    "context_management": OBJECT,
    "diagnostics": OBJECT,
    "inference_geo": STRING,
    "max_tokens": INTEGER,
    "mcp_servers": ARRAY,
    "metadata": OBJECT,
    "output_config": OBJECT,
    "service_tier": STRING,
    "speed": STRING,
    "stop_sequences": ARRAY,
    "stream": BOOLEAN,
    "system": STRING_OR_ARRAY,
    "temperature": NUMBER,
    "thinking": OBJECT,
    "tool_choice": OBJECT,
    "tools": ARRAY,
    "top_k": INTEGER,
    "top_p": NUMBER,
}
# Inside them: what an anthropic upstream reads (passed through to it) or this module does.
_THINKING_FIELDS = {"type": STRING, "budget_tokens": INTEGER, "display": STRING}
_CHOICE_FIELDS = {"type": STRING, "name": STRING, "disable_parallel_tool_use": BOOLEAN}
_THINKING_BLOCK_FIELDS = {"thinking": STRING, "signature": STRING, "data": STRING}
# Canonical fields whose Messages names differ, whatever the request holds.
_RENAMED: Origins = {
    "stop": "stop_sequences",
    "user": "metadata.user_id",
    "tool_choice.function": "tool_choice",
    "response_format": "output_config.format",
    "response_format.json_schema": "output_config.format",
    "stream_options": "stream",
}


def to_chat_request(body: JSON, *, counting: bool = False, origins: Origins | None = None) -> JSON:
    """Translate an Anthropic Messages request into a canonical chat request; with
    ``origins``, note there which field of ``body`` each renamed canonical part came from.

    ``counting``: ``body`` is a ``count_tokens`` request, which has no ``max_tokens``.
    Raises InvalidRequestError (``param`` names the field) for a malformed request or one
    that uses something the gateway cannot honour.
    """
    want_dict(body, "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("model: a non-empty string is required", param="model")
    check_types(body, _FIELDS)
    if (thinking := body.get("thinking")) is not None:
        check_types(thinking, _THINKING_FIELDS, "thinking")
        if not isinstance(thinking.get("type"), str):
            raise InvalidRequestError("thinking.type: a string is required", param="thinking.type")
    if (choice := body.get("tool_choice")) is not None:
        check_types(choice, _CHOICE_FIELDS, "tool_choice")
        if choice.get("type") not in _TOOL_CHOICE_TYPES:
            raise InvalidRequestError(
                "tool_choice.type: must be auto, any, tool or none", param="tool_choice.type"
            )
    if body.get("max_tokens") is None and not counting:
        raise InvalidRequestError("max_tokens: required by the Messages API", param="max_tokens")
    max_tokens = want_positive_int(body, "max_tokens")
    for key in _REFUSED_TOP_LEVEL:
        if body.get(key):
            raise InvalidRequestError(f"{key}: not supported by this gateway", param=key)

    messages: list[JSON] = []
    system = body.get("system")
    if system is not None:
        prompt = _system_prompt(system, "system")
        if isinstance(prompt, str):
            append_system(messages, prompt)
        else:  # marked for caching: one part per block, each keeping its mark
            messages.append({"role": "system", "content": prompt})
        if origins is not None and messages:
            origins["messages[0]"] = "system"
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise InvalidRequestError("messages: a non-empty array is required", param="messages")
    for i, msg in enumerate(raw):
        _convert_message(msg, f"messages[{i}]", messages, origins)

    chat: JSON = {"model": model, "messages": messages, "max_tokens": max_tokens}
    chat[CLAUDE_NATIVE] = claude_native(body)  # for a Claude route: others drop it
    stops = body.get("stop_sequences")
    if stops is not None:
        if not all(isinstance(s, str) for s in want_list(stops, "stop_sequences")):
            raise InvalidRequestError("stop_sequences: must be strings", param="stop_sequences")
        if stops:
            chat["stop"] = stops
    for key in ("temperature", "top_p"):
        value = want_number(body, key)
        if value is not None:
            chat[key] = value
    if body.get("tools"):
        chat["tools"] = _convert_tools(want_list(body["tools"], "tools"))
        if body.get("tool_choice") is not None:
            _convert_tool_choice(want_dict(body["tool_choice"], "tool_choice"), chat)
    metadata = body.get("metadata")
    if metadata is not None:
        user = want_dict(metadata, "metadata").get("user_id")
        if isinstance(user, str) and user:
            chat["user"] = user
    _convert_output_format(body.get("output_config"), chat)
    if thinking is not None:
        chat["thinking"] = thinking
        chat[CLAUDE_THINKING] = True  # Claude's config: an openai_compat route drops both
    if body.get("cache_control") is not None:  # an object: check_types saw to it
        chat["cache_control"] = body["cache_control"]
    if (
        "cache_control" in chat
        or any(map(_marked, messages))
        or any(map(_marked_part, chat.get("tools", ())))
    ):
        chat[CLAUDE_CACHE] = True  # an openai_compat route drops the marks
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequestError("stream: must be a boolean", param="stream")
    if stream:
        chat["stream"] = True
        # The Messages stream reports usage in message_delta; chat only sends it when asked.
        chat["stream_options"] = {"include_usage": True}
    if origins is not None:
        origins.update(_RENAMED)
        for i in range(len(chat.get("tools", ()))):
            origins[f"tools[{i}].function.parameters"] = f"tools[{i}].input_schema"
            origins[f"tools[{i}].function"] = f"tools[{i}]"
    return chat


def origins_of(body: JSON) -> Origins:
    """Where each renamed canonical part of ``body``'s translation came from (``body``
    translated before, without error)."""
    origins: Origins = {}
    to_chat_request(body, counting=True, origins=origins)
    return origins


def _system_prompt(system: Any, param: str) -> str | list[JSON]:
    """The system prompt as one string, or as text parts when a block is marked for
    caching (where the mark sits decides what Claude caches)."""
    if isinstance(system, str):
        return system
    parts = []
    for j, block in enumerate(want_list(system, param)):
        path = f"{param}[{j}]"
        if want_dict(block, path).get("type") != "text":
            raise InvalidRequestError(
                f"{path}.type: only text blocks are allowed here", param=f"{path}.type"
            )
        parts.append(_cached({"type": "text", "text": want_str(block, "text", path)}, block, path))
    if any(map(_marked_part, parts)):
        return parts
    return _JOIN.join(part["text"] for part in parts)


def _cached(part: JSON, block: JSON, path: str) -> JSON:
    """``part`` with ``block``'s ``cache_control`` mark, when it has one."""
    mark = block.get("cache_control")
    if mark is not None:
        part["cache_control"] = want_dict(mark, f"{path}.cache_control")
    return part


def _marked_part(part: Any) -> bool:
    return type(part) is dict and "cache_control" in part


def _marked(message: JSON) -> bool:
    """Whether a canonical message holds a part marked for caching."""
    content = message.get("content")
    return type(content) is list and any(map(_marked_part, content))


def _convert_message(msg: Any, path: str, out: list[JSON], origins: Origins | None) -> None:
    want_dict(msg, path)
    role = msg.get("role")
    if role not in ("user", "assistant"):
        # As the Messages API does: a system prompt goes in the top-level ``system``.
        raise InvalidRequestError(
            f"{path}.role: must be 'user' or 'assistant' (a system prompt goes in the "
            "top-level 'system' field)",
            param=f"{path}.role",
        )
    content = msg.get("content")
    if origins is not None:
        origins[f"messages[{len(out)}]"] = path
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        return
    if not isinstance(content, list):
        raise InvalidRequestError(
            f"{path}.content: must be a string or an array of blocks", param=f"{path}.content"
        )
    if role == "assistant":
        out.append(_assistant_message(content, path, len(out), origins))
    else:
        _user_messages(content, path, out, origins)


def _block_type(block: Any, path: str) -> str:
    kind = want_dict(block, path).get("type")
    if not isinstance(kind, str):
        raise InvalidRequestError(f"{path}.type: must be a string", param=f"{path}.type")
    return kind


def _unsupported(kind: str, path: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"{path}.type: '{kind}' blocks are not supported by this gateway", param=f"{path}.type"
    )


def _assistant_message(content: list[Any], path: str, index: int, origins: Origins | None) -> JSON:
    """The chat message of an assistant turn, the ``index``-th of the chat request."""
    texts: list[str] = []
    parts: list[JSON] = []  # the text blocks as chat parts, for their cache marks
    calls: list[JSON] = []
    thinking: list[JSON] = []
    for j, block in enumerate(content):
        bpath = f"{path}.content[{j}]"
        kind = _block_type(block, bpath)
        if kind == "text":
            texts.append(want_str(block, "text", bpath))
            parts.append(_cached({"type": "text", "text": texts[-1]}, block, bpath))
        elif kind == "tool_use":
            tool_input = want_dict(block.get("input"), f"{bpath}.input")
            calls.append(
                {
                    "id": want_str(block, "id", bpath),
                    "type": "function",
                    "function": {
                        "name": want_str(block, "name", bpath),
                        "arguments": json_text(tool_input),
                    },
                }
            )
            if origins is not None:
                call = f"messages[{index}].tool_calls[{len(calls) - 1}]"
                origins[call] = origins[f"{call}.function"] = bpath
                origins[f"{call}.function.arguments"] = f"{bpath}.input"
        elif kind in ("thinking", "redacted_thinking"):
            # Absent is empty: such a block was always let through, and one with no
            # signature or data only ever reaches a route that drops it.
            check_types(block, _THINKING_BLOCK_FIELDS, bpath)
            if kind == "thinking":
                thought, signature = block.get("thinking") or "", block.get("signature") or ""
                thinking.append({"type": kind, "thinking": thought, "signature": signature})
            else:
                thinking.append({"type": kind, "data": block.get("data") or ""})
            if after := any(texts) + len(calls):  # interleaved: where it was, for the adapter
                thinking[-1]["after"] = after
        else:
            raise _unsupported(kind, bpath)
    message: JSON = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if any(map(_marked_part, parts)):
        message["content"] = parts
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["thinking_blocks"] = thinking
    return message


def _user_messages(content: list[Any], path: str, out: list[JSON], origins: Origins | None) -> None:
    # Chat wants tool answers as separate `tool` messages right after the assistant turn, so
    # tool_result blocks are emitted first and the rest of the turn follows as one user message.
    parts: list[JSON] = []
    part_paths: list[str] | None = None if origins is None else []  # each part's block
    for j, block in enumerate(content):
        bpath = f"{path}.content[{j}]"
        kind = _block_type(block, bpath)
        if kind == "text":
            parts.append(
                _cached({"type": "text", "text": want_str(block, "text", bpath)}, block, bpath)
            )
        elif kind in _MEDIA:
            parts.append(_cached(_MEDIA[kind](block, bpath), block, bpath))
        elif kind == "tool_result":
            if origins is not None:
                origins[f"messages[{len(out)}]"] = bpath
                origins[f"messages[{len(out)}].tool_call_id"] = f"{bpath}.tool_use_id"
            out.append(_tool_message(block, bpath, parts, part_paths))
        else:
            raise _unsupported(kind, bpath)
        if part_paths is not None and len(part_paths) < len(parts):
            part_paths.append(bpath)
    if origins is not None and part_paths:
        # The turn's other blocks, after its tool results: one user message.
        at = f"messages[{len(out)}]"
        origins[at] = path
        origins[f"{at}.content"] = f"{path}.content"
        for p, block_path in enumerate(part_paths):
            origins[f"{at}.content[{p}]"] = block_path
            origins[f"{at}.content[{p}].image_url.url"] = f"{block_path}.source"
            origins[f"{at}.content[{p}].file.file_data"] = f"{block_path}.source"
    if len(parts) == 1 and parts[0]["type"] == "text" and not _marked_part(parts[0]):
        out.append({"role": "user", "content": parts[0]["text"]})
    elif parts:
        out.append({"role": "user", "content": parts})
    elif not content:
        raise InvalidRequestError(f"{path}.content: must not be empty", param=f"{path}.content")


def _tool_message(
    block: JSON, path: str, user_parts: list[JSON], part_paths: list[str] | None
) -> JSON:
    """A chat tool message; images of the result go to ``user_parts`` (chat tool messages
    carry text only), and their paths to ``part_paths`` when that is kept."""
    call_id = want_str(block, "tool_use_id", path)
    raw = block.get("content", "")
    result = _cached({"type": "text"}, block, path)  # the mark of the block or its last text
    if isinstance(raw, str):
        text = raw
    else:
        texts = []
        for k, item in enumerate(want_list(raw, f"{path}.content")):
            ipath = f"{path}.content[{k}]"
            kind = _block_type(item, ipath)
            if kind == "text":
                texts.append(want_str(item, "text", ipath))
                _cached(result, item, ipath)
            elif kind in _MEDIA:  # chat tool messages carry text only
                user_parts.append(_cached(_MEDIA[kind](item, ipath), item, ipath))
                if part_paths is not None:
                    part_paths.append(ipath)
            else:
                raise _unsupported(kind, ipath)
        text = _JOIN.join(texts)
    if block.get("is_error") is True:
        text = TOOL_ERROR_PREFIX + text
    if _marked_part(result):
        return {"role": "tool", "tool_call_id": call_id, "content": [{**result, "text": text}]}
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _convert_tools(tools: list[Any]) -> list[JSON]:
    out = []
    for i, tool in enumerate(tools):
        path = f"tools[{i}]"
        kind = want_dict(tool, path).get("type")
        if kind not in (None, "custom"):
            raise InvalidRequestError(
                f"{path}.type: server tool '{kind}' is not supported by this gateway; "
                "only client (custom) tools are",
                param=f"{path}.type",
            )
        function: JSON = {
            "name": want_str(tool, "name", path),
            "parameters": want_dict(tool.get("input_schema"), f"{path}.input_schema"),
        }
        description = tool.get("description")
        if isinstance(description, str) and description:
            function["description"] = description
        if isinstance(tool.get("strict"), bool):
            function["strict"] = tool["strict"]
        out.append(_cached({"type": "function", "function": function}, tool, path))
    return out


def _convert_tool_choice(choice: JSON, chat: JSON) -> None:
    """``choice``, its type already one of :data:`_TOOL_CHOICE_TYPES`, in the chat shape."""
    kind = choice["type"]
    if kind == "tool":
        chat["tool_choice"] = {
            "type": "function",
            "function": {"name": want_str(choice, "name", "tool_choice")},
        }
    else:
        chat["tool_choice"] = _TOOL_CHOICE[kind]
    if choice.get("disable_parallel_tool_use") is True and kind != "none":
        chat["parallel_tool_calls"] = False


def _convert_output_format(config: Any, chat: JSON) -> None:
    if config is None:
        return
    fmt = want_dict(config, "output_config").get("format")
    if fmt is None:
        return
    if want_dict(fmt, "output_config.format").get("type") != "json_schema":
        raise InvalidRequestError(
            "output_config.format.type: must be 'json_schema'", param="output_config.format.type"
        )
    schema = want_dict(fmt.get("schema"), "output_config.format.schema")
    # Anthropic's structured output is always strict.
    chat["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }
