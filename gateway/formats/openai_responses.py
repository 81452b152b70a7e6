"""OpenAI Responses client surface (``POST /v1/responses``) <-> the canonical chat shape.

Requests: :func:`to_chat_request`. Answers, streams and errors: :func:`from_chat_response`,
:class:`ChatToResponsesStream`, :func:`error_body` (in ``_canonical_to_responses``, re-exported).

The gateway is stateless: ``previous_response_id``, ``conversation``, ``item_reference``
items, ``background`` and stored ``prompt`` templates are refused, and ``store: true`` is
accepted but nothing is stored (a later ``previous_response_id`` naming the answer is
refused). A ``reasoning`` input item whose ``encrypted_content`` is this gateway's (Claude's
signed thinking, ``_responses_reasoning``) gives its blocks, in order, to the assistant
message of its turn: the one the next ``message`` or ``function_call`` item builds or joins,
else (its turn ends first) the one just before it; its ``reasoning_text`` content (what this
gateway answers for an upstream's ``reasoning_content``: DeepSeek's, vLLM's) goes there too,
as that message's ``reasoning_content``, as a chat client sends it (DeepSeek's thinking mode
refuses a tool turn without it; the translating adapters ignore it). Dropped, because chat
has no equivalent and leaving them out changes no answer's validity: the rest of
``reasoning`` input items (another provider's encrypted reasoning cannot be replayed to
another model, and unsigned text is what Claude refuses), ``include`` (but for
``reasoning.encrypted_content``, read by the answer), ``truncation`` (an over-long input
fails instead of being cut; a value other than ``auto`` or ``disabled`` is refused, as
OpenAI refuses it), ``max_tool_calls``, ``metadata`` (these echoed back, not sent
upstream). Sent on under chat's same names, as a chat client's are: ``prompt_cache_key``
(the upstream's prompt cache and the gateway's own affinity key on it),
``prompt_cache_retention``, ``safety_identifier``, ``service_tier`` and ``text.verbosity``
(chat's ``verbosity``). Custom (freeform) tools,
their calls and outputs become chat's custom tools (``_responses_tools``). Refused: hosted tools
(``web_search``, ``file_search``, ``code_interpreter``, ``mcp``, ``computer_use``...), their
items and tool choices, ``top_logprobs``, and file ids (nothing is stored to refer to).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.formats._canonical_to_responses import (
    ChatToResponsesStream,
    error_body,
    from_chat_response,
)
from gateway.formats._common import (
    JSON,
    append_system,
    want_dict,
    want_list,
    want_number,
    want_positive_int,
    want_str,
)
from gateway.formats._responses_reasoning import give_reasoning, reasoning_texts, unseal
from gateway.formats._responses_tools import (
    convert_tool_choice,
    convert_tools,
    forces_a_tool,
    tool_call,
)
from gateway.formats.openai_chat import (
    ARRAY,
    BOOLEAN,
    INTEGER,
    NUMBER,
    OBJECT,
    STRING,
    STRING_OR_OBJECT,
    check_types,
)
from schemas import InvalidRequestError
from schemas.keys import shown

if TYPE_CHECKING:
    from gateway.formats.client_paths import Origins

__all__ = ["ChatToResponsesStream", "error_body", "from_chat_response", "to_chat_request"]

_JOIN = "\n\n"
_STATELESS = "this gateway is stateless and stores no responses; send the whole conversation"
_REFUSED_TOP_LEVEL = {
    "previous_response_id": f"previous_response_id: {_STATELESS} in 'input'",
    "conversation": f"conversation: {_STATELESS} in 'input'",
    "prompt": "prompt: stored prompt templates are not supported by this gateway",
}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
# The documented request fields (openai's ResponseCreateParams) and their JSON types, also
# those this module drops: a mistyped one is the client's mistake either way.
_FIELDS = {
    "background": BOOLEAN,
    "conversation": STRING_OR_OBJECT,
    "include": ARRAY,
    "instructions": STRING,
    "max_output_tokens": INTEGER,
    "max_tool_calls": INTEGER,
    "metadata": OBJECT,
    "parallel_tool_calls": BOOLEAN,
    "previous_response_id": STRING,
    "prompt": OBJECT,
    "prompt_cache_key": STRING,
    "prompt_cache_retention": STRING,
    "reasoning": OBJECT,
    "safety_identifier": STRING,
    "service_tier": STRING,
    "store": BOOLEAN,
    "stream": BOOLEAN,
    "stream_options": OBJECT,
    "temperature": NUMBER,
    "text": OBJECT,
    "tool_choice": STRING_OR_OBJECT,
    "tools": ARRAY,
    "top_logprobs": INTEGER,
    "top_p": NUMBER,
    "truncation": STRING,
    "user": STRING,
}

# ``text.format``'s documented fields: those forwarded upstream must have their type here.
_FORMAT_FIELDS = {"description": STRING, "name": STRING, "schema": OBJECT, "strict": BOOLEAN}


# Canonical fields whose Responses names differ, whatever the request holds.
_RENAMED: Origins = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "response_format.json_schema": "text.format",
    "reasoning_effort": "reasoning.effort",
    "tool_choice.function": "tool_choice",
    "tool_choice.custom": "tool_choice",
    "tool_choice.allowed_tools": "tool_choice",
    "stream_options": "stream",
    "verbosity": "text.verbosity",
}
# Fields chat takes under the same name and meaning, sent on as they are.
# Input items that are a tool call of the assistant's turn, and a tool's output.
_CALLS = frozenset({"function_call", "custom_tool_call"})
_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
_SAME_IN_CHAT = ("prompt_cache_key", "prompt_cache_retention", "safety_identifier", "service_tier")


def to_chat_request(body: JSON, origins: Origins | None = None) -> JSON:
    """Translate a Responses request into a canonical chat request; with ``origins``, note
    there which field of ``body`` each renamed canonical part came from.

    Raises InvalidRequestError (``param`` names the field) for a malformed request, a
    stateful feature, or a hosted tool.
    """
    want_dict(body, "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("model: a non-empty string is required", param="model")
    check_types(body, _FIELDS)
    for key, message in _REFUSED_TOP_LEVEL.items():
        if body.get(key) is not None:
            raise InvalidRequestError(message, param=key)
    if body.get("background") is True:
        raise InvalidRequestError(
            "background: background responses are not supported by this gateway", param="background"
        )
    if body.get("truncation") not in (None, "auto", "disabled"):
        raise InvalidRequestError(
            f"truncation: must be 'auto' or 'disabled', not {shown(body['truncation'])}",
            param="truncation",
        )
    if body.get("top_logprobs"):
        raise InvalidRequestError(
            "top_logprobs: not supported by this gateway", param="top_logprobs"
        )

    messages: list[JSON] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise InvalidRequestError("instructions: must be a string", param="instructions")
        append_system(messages, instructions)
        if origins is not None and messages:
            origins["messages[0]"] = "instructions"
    raw = body.get("input")
    if isinstance(raw, str):
        if origins is not None:
            origins[f"messages[{len(messages)}]"] = "input"
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list) and raw:
        _convert_items(raw, messages, origins)
    else:
        raise InvalidRequestError(
            "input: a string or a non-empty array of items is required", param="input"
        )

    chat: JSON = {"model": model, "messages": messages}
    max_tokens = want_positive_int(body, "max_output_tokens")
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    for key in ("temperature", "top_p"):
        value = want_number(body, key)
        if value is not None:
            chat[key] = value
    if body.get("tools"):
        chat["tools"] = convert_tools(want_list(body["tools"], "tools"), origins)
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = convert_tool_choice(body["tool_choice"])
        if isinstance(body.get("parallel_tool_calls"), bool):
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    elif forces_a_tool(body.get("tool_choice")):
        # What OpenAI answers too: no route could honour it (dropped, the model just chatted).
        raise InvalidRequestError(
            "tool_choice: it asks for a tool call, but the request gives no 'tools'",
            param="tool_choice",
        )
    _convert_text(body.get("text"), chat)
    reasoning = body.get("reasoning")
    if reasoning is not None and want_dict(reasoning, "reasoning").get("effort") is not None:
        chat["reasoning_effort"] = want_str(reasoning, "effort", "reasoning")
    for key in ("user", *_SAME_IN_CHAT):
        value = body.get(key)
        if isinstance(value, str) and value:
            chat[key] = value
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequestError("stream: must be a boolean", param="stream")
    if stream:
        chat["stream"] = True
        # response.completed carries usage; chat only streams it when asked.
        chat["stream_options"] = {"include_usage": True}
    if origins is not None:
        origins.update(_RENAMED)
    return chat


def origins_of(body: JSON) -> Origins:
    """Where each renamed canonical part of ``body``'s translation came from (``body``
    translated before, without error)."""
    origins: Origins = {}
    to_chat_request(body, origins)
    return origins


def _convert_items(items: list[Any], out: list[JSON], origins: Origins | None) -> None:
    # Images returned by a tool wait here until the run of tool messages ends: chat tool
    # messages carry text only, and nothing may come between them.
    pending: list[JSON] = []
    pending_at: list[str] | None = None if origins is None else []  # where each came from
    thought: list[JSON] | None = None  # Claude's blocks waiting for their assistant message
    said: list[str] = []  # reasoning text waiting for it, as its reasoning_content
    for i, item in enumerate(items):
        path = f"input[{i}]"
        want_dict(item, path)
        kind = item.get("type", "message")
        if type(kind) is not str:  # an object is no item type (nor hashable)
            raise InvalidRequestError(f"{path}.type: must be a string", param=f"{path}.type")
        if pending and kind not in _OUTPUTS:
            _flush(pending, out, origins, pending_at)
            pending, pending_at = [], None if origins is None else []
        if (thought is not None or said) and kind != "reasoning" and kind not in _CALLS:
            if kind != "message" or item.get("role") != "assistant":  # the turn ended
                thought, said = give_reasoning(thought, said, out)
        size = len(out)
        if kind == "message":
            message = _message(item, path)
            if message["role"] == "system":
                append_system(out, message["content"])
            else:
                out.append(message)
                if thought is not None or said:
                    thought, said = give_reasoning(thought, said, out)
        elif kind in _CALLS:
            tool_call(item, path, out, origins)
            if thought is not None or said:
                thought, said = give_reasoning(thought, said, out)
        elif kind == "reasoning":
            if signed := unseal(item.get("encrypted_content"), f"{path}.encrypted_content"):
                thought = [*(thought or ()), *signed]
            said.extend(reasoning_texts(item, path))
        elif kind in _OUTPUTS:
            out.append(_function_output(item, path, pending, pending_at))
            if origins is not None:
                origins[f"messages[{size}].tool_call_id"] = f"{path}.call_id"
                origins[f"messages[{size}].content"] = f"{path}.output"
        elif kind == "item_reference":
            raise InvalidRequestError(
                f"{path}: {_STATELESS} items instead of references", param=f"{path}.type"
            )
        else:
            raise InvalidRequestError(
                f"{path}.type: '{kind}' items are not supported by this gateway",
                param=f"{path}.type",
            )
        if origins is not None:
            if len(out) > size:
                origins[f"messages[{size}]"] = path
            if kind == "message" and isinstance(item.get("content"), list):
                _part_origins(f"messages[{size}]", item["content"], f"{path}.content", origins)
    if pending:
        _flush(pending, out, origins, pending_at)
    if thought is not None or said:
        give_reasoning(thought, said, out)


def _flush(
    pending: list[JSON], out: list[JSON], origins: Origins | None, paths: list[str] | None
) -> None:
    """The images tool outputs returned, as one user message; ``paths``: each one's."""
    if origins is not None and paths is not None:
        at = f"messages[{len(out)}]"
        origins[at] = paths[0]
        for k, path in enumerate(paths):
            origins[f"{at}.content[{k}]"] = path
            origins[f"{at}.content[{k}].image_url.url"] = f"{path}.image_url"
            origins[f"{at}.content[{k}].file"] = path
    out.append({"role": "user", "content": pending})


def _part_origins(message: str, parts: list[Any], path: str, origins: Origins) -> None:
    # A user part keeps its index; its image URL and file data sit a level shallower here.
    for j, part in enumerate(parts):
        kind = part.get("type")
        if kind == "input_image":
            origins[f"{message}.content[{j}].image_url.url"] = f"{path}[{j}].image_url"
        elif kind == "input_file":
            origins[f"{message}.content[{j}].file"] = f"{path}[{j}]"


def _message(item: JSON, path: str) -> JSON:
    role_name = item.get("role")
    role = _ROLES.get(role_name) if isinstance(role_name, str) else None
    if role is None:
        raise InvalidRequestError(
            f"{path}.role: must be user, assistant, system or developer", param=f"{path}.role"
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    parts = want_list(content, f"{path}.content")
    if role == "user":
        converted = [_user_part(p, f"{path}.content[{j}]") for j, p in enumerate(parts)]
        if len(converted) == 1 and converted[0]["type"] == "text":
            return {"role": "user", "content": converted[0]["text"]}
        return {"role": "user", "content": converted}
    texts = []
    for j, part in enumerate(parts):
        ppath = f"{path}.content[{j}]"
        kind = want_dict(part, ppath).get("type")
        if kind in ("input_text", "output_text"):
            texts.append(want_str(part, "text", ppath))
        elif kind == "refusal" and role == "assistant":
            texts.append(want_str(part, "refusal", ppath))
        else:
            raise InvalidRequestError(
                f"{ppath}.type: '{kind}' is not allowed in a {role} message", param=f"{ppath}.type"
            )
    return {"role": role, "content": ("" if role == "assistant" else _JOIN).join(texts)}


def _user_part(part: Any, path: str) -> JSON:
    kind = want_dict(part, path).get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": want_str(part, "text", path)}
    if kind == "input_image":
        if not part.get("image_url"):
            raise InvalidRequestError(
                f"{path}.image_url: required (file ids are not "
                "supported by this stateless gateway)",
                param=f"{path}.image_url",
            )
        image: JSON = {"url": want_str(part, "image_url", path)}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "input_file":
        if not part.get("file_data"):
            raise InvalidRequestError(
                f"{path}.file_data: required (file ids and file URLs are not supported)",
                param=f"{path}.file_data",
            )
        file: JSON = {"file_data": want_str(part, "file_data", path)}
        if isinstance(part.get("filename"), str):
            file["filename"] = part["filename"]
        return {"type": "file", "file": file}
    raise InvalidRequestError(
        f"{path}.type: '{kind}' content is not supported", param=f"{path}.type"
    )


def _function_output(
    item: JSON, path: str, pending: list[JSON], pending_at: list[str] | None
) -> JSON:
    call_id = want_str(item, "call_id", path)
    output = item.get("output")
    if isinstance(output, str):
        text = output
    else:
        texts = []
        for j, part in enumerate(want_list(output, f"{path}.output")):
            converted = _user_part(part, f"{path}.output[{j}]")
            if converted["type"] == "text":
                texts.append(converted["text"])
            else:
                pending.append(converted)
                if pending_at is not None:
                    pending_at.append(f"{path}.output[{j}]")
        text = _JOIN.join(texts)
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _convert_text(text: Any, chat: JSON) -> None:
    if text is None:
        return
    verbosity = want_dict(text, "text").get("verbosity")
    if verbosity is not None:
        chat["verbosity"] = want_str(text, "verbosity", "text")
    fmt = text.get("format")
    if fmt is None:
        return
    kind = want_dict(fmt, "text.format").get("type")
    check_types(fmt, _FORMAT_FIELDS, "text.format")
    if kind == "json_schema":
        schema: JSON = {
            "name": want_str(fmt, "name", "text.format"),
            "schema": want_dict(fmt.get("schema"), "text.format.schema"),
        }
        for key in ("strict", "description"):
            if fmt.get(key) is not None:
                schema[key] = fmt[key]
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif kind == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif kind != "text":
        raise InvalidRequestError(
            f"text.format.type: '{kind}' is not supported", param="text.format.type"
        )
