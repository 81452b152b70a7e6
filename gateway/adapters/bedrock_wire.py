"""Upstream kind ``bedrock``: canonical chat <-> the AWS Bedrock Converse wire (pure).

Requests: :func:`to_converse_request` (the body of ``Converse`` and ``ConverseStream``; the
model id rides in the URL). Answers: :func:`from_converse_response`; streams:
:class:`ConverseToChatStream`, fed the decoded event-stream messages. Shapes follow botocore's
service model for ``bedrock-runtime`` (``ConverseRequest``, ``ConverseResponse``,
``ConverseStreamOutput``).

An answer or stream event whose fields read here break those shapes (a string where an
object belongs, a text of 5) is an UpstreamBadResponseError, absent or null being as if
empty where the service model allows; usage that is not sane is unknown.

A guardrail or content filter that stops the answer (``guardrail_intervened``,
``content_filtered``) is an answer, not a failure: it becomes a refusal with finish reason
``content_filter``, which every client surface renders as its own refusal.

Dropped, because Converse has no equivalent and leaving them out changes no answer's
validity: ``frequency_penalty``, ``presence_penalty``, ``seed``, ``user``, ``metadata``,
``store``, ``service_tier``, ``stream_options``, ``parallel_tool_calls``, message ``name``s,
and, for models other than Claude, the ``thinking`` config and an assistant message's
``thinking_blocks`` (Claude's, signed for Claude alone). Refused (InvalidRequestError):
``n`` > 1, ``logprobs``, ``logit_bias``, audio, legacy ``functions``, non-function tools,
``response_format`` ``json_object``, images that are not base64 data URLs of
png/jpeg/gif/webp, files (``document`` blocks, named after the file) that are not base64 data
URLs of a document type Converse reads, tool arguments that are not a JSON object.

Claude on Bedrock (a model id ``anthropic.*`` or ``<region>.anthropic.*``, or a route's
``bedrock.model_family: anthropic`` for an opaque id, as ``claude=`` says) thinks as on the
Anthropic API: the ``thinking`` config (or one made from ``reasoning_effort``, with the
anthropic adapter's budgets and rules) goes in ``additionalModelRequestFields``, what Claude
refuses while a config has it think is refused here, and an assistant message's signed
``thinking_blocks`` go back as ``reasoningContent`` blocks (``reasoningText`` with its
``signature``, or ``redactedContent``), first in that turn or where ``after`` puts them.
Answers and streams: every ``reasoningContent`` text is ``reasoning_content``; a signed or
redacted one is also a ``thinking_blocks`` entry, as from the anthropic adapter (streamed: at
its ``contentBlockStop``). Claude's prompt-caching marks (``cache_control`` on a content part,
a tool, the request) become ``cachePoint`` blocks (:mod:`gateway.adapters.bedrock_cache`);
other models' are dropped. A Messages client's ``top_k`` (``_claude_native``) goes in
``additionalModelRequestFields`` and its ``is_error`` tool results as ``status: error``.
"""

from __future__ import annotations

import re
import time
from typing import Any

import msgspec

from gateway.adapters._anthropic_to_canonical import place_thinking
from gateway.adapters.answer_fields import bad_answer, new_id, object_field, text_field
from gateway.adapters.anthropic_wire import DEFAULT_MAX_TOKENS, claude_thinking
from gateway.adapters.bedrock_cache import last_points, mark_request, points, system_blocks
from gateway.adapters.chat_message import (
    answered_call,
    interleave,
    join_turn,
    signed_thinking,
    text_of,
    tool_calls,
)
from gateway.adapters.provider_usage import cached_usage, one_hour_writes, provider_counts
from schemas import InvalidRequestError
from schemas.canonical_markers import CLAUDE_NATIVE, TOOL_ERROR_PREFIX

JSON = dict[str, Any]

_REFUSED = {
    "logprobs": "logprobs: not available from bedrock upstreams",
    "top_logprobs": "top_logprobs: not available from bedrock upstreams",
    "logit_bias": "logit_bias: not supported by bedrock upstreams",
    "audio": "audio: audio output is not supported by bedrock upstreams",
    "functions": "functions: the legacy functions API is not supported; use tools",
    "function_call": "function_call: the legacy functions API is not supported; use tool_choice",
}
_DOCUMENT_FORMATS = {
    "application/pdf": "pdf",
    "text/csv": "csv",
    "application/msword": "doc",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": "docx",
    "application/vnd.ms-excel": "xls",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": "xlsx",
    "text/html": "html",
    "text/plain": "txt",
    "text/markdown": "md",
}
_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9\-()\[\] ]")
_IMAGE_FORMATS = {
    "image/png": "png",
    "image/jpeg": "jpeg",
    "image/gif": "gif",
    "image/webp": "webp",
}
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}
REFUSALS = frozenset({"guardrail_intervened", "content_filtered"})
"""Stop reasons that say a guardrail or filter refused: the text is the refusal."""
_BROKEN = frozenset({"malformed_model_output", "malformed_tool_use"})
"""Stop reasons that say the model's answer broke: nothing to hand on (as ``stop`` a client
took a cut answer, or one without its tool call, for a whole one)."""
_encode = msgspec.json.Encoder().encode


def to_converse_request(chat: JSON, *, claude: bool = False) -> JSON:
    """The Converse request body for a canonical chat request (``claude``: for a Claude
    model, which thinks as the module docstring says).

    Raises InvalidRequestError (``param`` names the field) for what Converse cannot honour.
    """
    for key, message in _REFUSED.items():
        if chat.get(key):
            raise InvalidRequestError(message, param=key)
    if chat.get("n") not in (None, 1):
        raise InvalidRequestError("n: bedrock upstreams return exactly one choice", param="n")
    messages = chat.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages: a non-empty array is required", param="messages")
    native = chat.get(CLAUDE_NATIVE) if claude else None
    native = native if type(native) is dict else {}
    errors = frozenset(native.get("tool_errors") or ())
    system, converted = _convert_messages(messages, claude, errors)
    mark_request(chat, converted, claude)
    req: JSON = {"messages": converted}
    if system:
        req["system"] = system
    inference = _inference_config(chat)
    if claude:
        _claude_thinking(chat, req, inference)
        if native.get("top_k") is not None:
            req.setdefault("additionalModelRequestFields", {})["top_k"] = native["top_k"]
    if inference:
        req["inferenceConfig"] = inference
    if chat.get("tools"):
        tool_config = _tool_config(chat, claude)
        if tool_config is not None:
            req["toolConfig"] = tool_config
    output = _output_config(chat.get("response_format"))
    if output is not None:
        req["outputConfig"] = output
    return req


def _inference_config(chat: JSON) -> JSON:
    out: JSON = {}
    max_tokens = chat.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = chat.get("max_tokens")
    if max_tokens is not None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise InvalidRequestError("max_tokens: must be an integer >= 1", param="max_tokens")
        out["maxTokens"] = max_tokens
    if chat.get("temperature") is not None:
        out["temperature"] = chat["temperature"]
    if chat.get("top_p") is not None:
        out["topP"] = chat["top_p"]
    stop = chat.get("stop")
    if isinstance(stop, str):
        out["stopSequences"] = [stop]
    elif isinstance(stop, list) and stop:
        out["stopSequences"] = stop
    return out


def _claude_thinking(chat: JSON, req: JSON, inference: JSON) -> None:
    """Claude's thinking config in ``additionalModelRequestFields``. Raises
    InvalidRequestError as the anthropic adapter does (sampling refused while thinking)."""
    thinking = claude_thinking(chat, inference.get("maxTokens"))
    if thinking is None:
        return
    budget = thinking.get("budget_tokens")
    if "maxTokens" not in inference and type(budget) is int and budget > 0:
        inference["maxTokens"] = DEFAULT_MAX_TOKENS + budget  # Claude wants it above the budget
    req["additionalModelRequestFields"] = {"thinking": thinking}


def _convert_messages(
    messages: list[Any], claude: bool, errors: frozenset[str]
) -> tuple[list[JSON], list[JSON]]:
    """The system blocks and the messages; a Claude model's cache marks as ``cachePoint``s,
    and the tool results whose ids are in ``errors`` as ``status: error``."""
    system: list[JSON] = []
    out: list[JSON] = []
    for i, msg in enumerate(messages):
        path = f"messages[{i}]"
        role = msg.get("role") if isinstance(msg, dict) else None
        if role in ("system", "developer"):
            content = msg.get("content")
            system += system_blocks(content, text_of(content, path), claude)
        elif role == "user":
            _append(out, "user", _user_blocks(msg.get("content"), path, claude))
        elif role == "assistant":
            _append(out, "assistant", _assistant_blocks(msg, path, claude))
        elif role == "tool":
            marks = last_points(msg.get("content"), claude)
            _append(out, "user", [_tool_result(msg, path, errors), *marks])
        else:
            raise InvalidRequestError(f"{path}.role: unknown role {role!r}", param=f"{path}.role")
    return system, out


def _append(out: list[JSON], role: str, blocks: list[JSON]) -> None:
    # Converse wants roles to alternate; a tool turn's results go in one user message.
    if not blocks:
        return
    if out and out[-1]["role"] == role:
        join_turn(out[-1]["content"], blocks, _is_reasoning)
    else:
        out.append({"role": role, "content": blocks})


def _user_blocks(content: Any, path: str, caching: bool) -> list[JSON]:
    if not isinstance(content, list):
        text = text_of(content, path)
        return [{"text": text}] if text else []
    blocks: list[JSON] = []
    for j, part in enumerate(content):
        ppath = f"{path}.content[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            if not part.get("text"):
                continue
            blocks.append({"text": part["text"]})
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            blocks.append(_image_block(url, f"{ppath}.image_url.url"))
        elif kind == "file":
            blocks.append(_document_block(part.get("file"), f"{ppath}.file", j))
        else:
            raise InvalidRequestError(
                f"{ppath}.type: '{kind}' parts are not supported by bedrock upstreams",
                param=f"{ppath}.type",
            )
        blocks += points(part, caching)
    return blocks


def _image_block(url: Any, path: str) -> JSON:
    if not isinstance(url, str) or not url.startswith("data:"):
        raise InvalidRequestError(
            f"{path}: bedrock upstreams take images inline as base64 data URLs", param=path
        )
    header, _, data = url[5:].partition(",")
    media_type, _, encoding = header.partition(";")
    image_format = _IMAGE_FORMATS.get(media_type)
    if encoding != "base64" or image_format is None:
        raise InvalidRequestError(
            f"{path}: bedrock upstreams take base64 png, jpeg, gif or webp images", param=path
        )
    # The JSON wire carries a blob as base64, which the data URL already is.
    return {"image": {"format": image_format, "source": {"bytes": data}}}


def _document_block(file: Any, path: str, index: int) -> JSON:
    data_url = file.get("file_data") if isinstance(file, dict) else None
    if not isinstance(data_url, str) or not data_url.startswith("data:"):
        data_url = "data:,"
    header, _, data = data_url[5:].partition(",")
    media_type, _, encoding = header.partition(";")
    doc_format = _DOCUMENT_FORMATS.get(media_type)
    if encoding != "base64" or doc_format is None:
        raise InvalidRequestError(
            f"{path}.file_data: bedrock upstreams take files inline as base64 data URLs of "
            "pdf, csv, doc(x), xls(x), html, txt or md",
            param=f"{path}.file_data",
        )
    # Converse's name: letters, digits, spaces, hyphens, parentheses, brackets, one space apart.
    stem = str(file.get("filename") or "").rsplit(".", 1)[0]
    name = " ".join(_NOT_IN_NAME.sub(" ", stem).split())[:100] or f"document-{index}"
    return {"document": {"format": doc_format, "name": name, "source": {"bytes": data}}}


def _is_reasoning(block: JSON) -> bool:
    return "reasoningContent" in block


def _assistant_blocks(msg: JSON, path: str, claude: bool) -> list[JSON]:
    text = text_of(msg.get("content"), path)
    blocks: list[JSON] = [{"text": text}] if text else []
    for call_id, name, arguments in tool_calls(msg, path):
        blocks.append({"toolUse": {"toolUseId": call_id, "name": name, "input": arguments}})
    if claude and (signed := msg.get("thinking_blocks")):
        blocks = interleave(signed_thinking(signed, _reasoning_text, _redacted_content), blocks)
    if text and (marks := last_points(msg.get("content"), claude)):
        # After the text, placed once ``interleave`` has counted the turn's items.
        at = next(i for i, block in enumerate(blocks) if "text" in block) + 1
        blocks[at:at] = marks
    return blocks


def _reasoning_text(text: str, signature: str) -> JSON:
    return {"reasoningContent": {"reasoningText": {"text": text, "signature": signature}}}


def _redacted_content(data: str) -> JSON:
    return {"reasoningContent": {"redactedContent": data}}  # base64, as a blob goes in JSON


def _tool_result(msg: JSON, path: str, errors: frozenset[str]) -> JSON:
    call_id = answered_call(msg, path)
    text = text_of(msg.get("content"), path)
    if call_id in errors:  # said as Claude reads it, not by the prefix other routes get
        said = text.removeprefix(TOOL_ERROR_PREFIX)
        result = {"toolUseId": call_id, "content": [{"text": said}]}
        return {"toolResult": {**result, "status": "error"}}
    return {"toolResult": {"toolUseId": call_id, "content": [{"text": text}], "status": "success"}}


def _tool_config(chat: JSON, claude: bool) -> JSON | None:
    tools: list[JSON] = []
    for i, tool in enumerate(chat["tools"]):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function":
            raise InvalidRequestError(
                f"tools[{i}].type: only function tools are supported by bedrock upstreams",
                param=f"tools[{i}].type",
            )
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(
                f"tools[{i}].function.name: required", param=f"tools[{i}].function.name"
            )
        spec: JSON = {
            "name": name,
            "inputSchema": {
                "json": function.get("parameters") or {"type": "object", "properties": {}}
            },
        }
        if function.get("description"):
            spec["description"] = function["description"]
        tools += [{"toolSpec": spec}, *points(tool, claude)]
    choice = chat.get("tool_choice")
    if choice == "none":
        return None  # Converse has no "none": not offering the tools is the same constraint
    config: JSON = {"tools": tools}
    if choice == "auto":
        config["toolChoice"] = {"auto": {}}
    elif choice == "required":
        config["toolChoice"] = {"any": {}}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if not isinstance(name, str):
            raise InvalidRequestError(
                "tool_choice.function.name: required", param="tool_choice.function.name"
            )
        config["toolChoice"] = {"tool": {"name": name}}
    elif choice is not None:
        raise InvalidRequestError(
            "tool_choice: not supported by bedrock upstreams", param="tool_choice"
        )
    return config


def _output_config(fmt: Any) -> JSON | None:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind is None or kind == "text":
        return None
    spec = fmt.get("json_schema") if kind == "json_schema" else None
    if isinstance(spec, dict) and isinstance(spec.get("schema"), dict):
        definition: JSON = {"schema": _encode(spec["schema"]).decode()}
        if isinstance(spec.get("name"), str):
            definition["name"] = spec["name"]
        return {"textFormat": {"type": "json_schema", "structure": {"jsonSchema": definition}}}
    raise InvalidRequestError(
        f"response_format: '{kind}' cannot be honoured by bedrock upstreams "
        "(use json_schema with a schema)",
        param="response_format",
    )


def chat_usage(usage: Any) -> JSON | None:
    """Chat usage from Converse ``TokenUsage`` (Converse counts cache reads and writes apart
    from ``inputTokens``; ``cacheDetails``, the writes by TTL); None when a count is not one."""
    counts = ("inputTokens", "cacheReadInputTokens", "cacheWriteInputTokens", "outputTokens")
    return cached_usage(provider_counts(usage, *counts), one_hour_writes(usage))


def finish_reason(stop_reason: Any, usage: Any = None) -> str:
    """The chat finish reason for a Converse ``stopReason`` (unknown: ``stop``). Raises
    UnusableAnswerError, carrying the ``usage`` billed, for a broken answer (:data:`_BROKEN`)."""
    if stop_reason in _BROKEN:
        broken = bad_answer(f"the answer ended with stopReason {stop_reason}", unusable=True)
        broken.usage = None if usage is None else chat_usage(usage)
        raise broken
    return _FINISH.get(stop_reason, "stop") if isinstance(stop_reason, str) else "stop"


def from_converse_response(data: JSON, *, model: str) -> JSON:
    """A canonical chat completion from a Converse answer (``output.message`` must exist).

    Raises UpstreamBadResponseError when it breaks ``ConverseResponse``'s shapes: the
    message's ``content`` not a list, a content block not an object, a ``text``,
    ``stopReason``, tool use id or name not a string, a ``toolUse`` or ``reasoningContent``
    not an object, a tool use's ``input`` not an object (the tool's schema is one). A
    ``usage`` that is not an object, or a count that is not a whole number, leaves the usage
    unknown (None)."""
    content = data["output"]["message"].get("content")
    if type(content) is not list:
        raise bad_answer("the answer's message has no 'content' list")
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[JSON] = []
    signed: list[JSON] = []
    for block in content:
        if type(block) is not dict:
            raise bad_answer("a content block is not an object")
        text = text_field(block, "text", "a content block")
        if text is not None:
            texts.append(text)
        elif (use := block.get("toolUse")) is not None:
            calls.append(_call(use))
        elif (thinking := block.get("reasoningContent")) is not None:
            if type(thinking) is not dict:
                raise bad_answer("a content block's 'reasoningContent' is not an object")
            said = object_field(thinking, "reasoningText", "a reasoningContent")
            if (thought := text_field(said, "text", "a reasoningText")) is not None:
                reasoning.append(thought)  # not when redactedContent: nothing to show
            claudes = reasoning_block(
                thought,
                text_field(said, "signature", "a reasoningText"),
                text_field(thinking, "redactedContent", "a reasoningContent"),
            )
            if claudes is not None:
                signed.append(place_thinking(claudes, any(texts) + len(calls)))
    stop = text_field(data, "stopReason", "the answer")
    text = "".join(texts)
    out: JSON = {"role": "assistant", "content": text if texts or not calls else None}
    out["refusal"] = None
    if stop in REFUSALS:
        out["content"], out["refusal"] = None, text or "The request was blocked by a guardrail."
    if reasoning:
        out["reasoning_content"] = "".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    if signed:
        out["thinking_blocks"] = signed
    finish = finish_reason(stop, data.get("usage"))
    return {
        "id": new_id("chatcmpl-"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": out, "finish_reason": finish, "logprobs": None}],
        "usage": chat_usage(data.get("usage")),
    }


def reasoning_block(
    thought: str | None, signature: str | None, redacted: str | None
) -> JSON | None:
    """The ``thinking_blocks`` entry of a ``reasoningContent``: Claude's, signed or redacted
    (on the JSON wire its blob is base64, kept as the ``data``); None for other models'."""
    if redacted:
        return {"type": "redacted_thinking", "data": redacted}
    if signature:
        return {"type": "thinking", "thinking": thought or "", "signature": signature}
    return None


def tool_use(use: Any, where: str) -> tuple[str, str, Any]:
    """A ``toolUse``'s ``toolUseId``, ``name`` and ``input`` (Converse's and ConverseStream's
    start). Raises UpstreamBadResponseError when it is not an object, or its id or name is
    not a string."""
    if type(use) is not dict:
        raise bad_answer(f"{where}'s 'toolUse' is not an object")
    call_id, name = use.get("toolUseId"), use.get("name")
    if type(call_id) is not str or type(name) is not str:
        raise bad_answer(f"{where}'s tool use 'toolUseId' or 'name' is not a string")
    return call_id, name, use.get("input")


def _call(use: Any) -> JSON:
    call_id, name, arguments = tool_use(use, "a content block")
    if arguments is not None and type(arguments) is not dict:
        raise bad_answer("a tool use's 'input' is not an object")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": _encode(arguments or {}).decode()},
    }
