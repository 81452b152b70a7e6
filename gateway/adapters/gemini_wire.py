"""Upstream kind ``gemini``: canonical chat -> the Gemini API's ``generateContent`` request
(pure). Answers and streams: ``_gemini_to_canonical`` (re-exported here).

Messages become ``contents`` (roles ``user`` and ``model``; consecutive turns of one role
merge), system and developer messages anywhere become ``systemInstruction``, tools become
``functionDeclarations`` (their JSON Schema as ``parametersJsonSchema``), assistant tool calls
``functionCall`` parts (with the ``thoughtSignature`` their id carries, see
``_gemini_to_canonical.call_id``) and tool results ``functionResponse`` parts (named after the
call they answer), images and files (a PDF) ``inlineData``; ``max_tokens``, ``temperature``,
``top_p``, ``stop``, ``n``, ``seed``, the penalties and ``response_format``
(``responseMimeType`` and ``responseJsonSchema``) go in ``generationConfig``. Dropped,
because Gemini has no equivalent and leaving them out changes no answer's validity: ``user``,
``metadata``, ``store``, ``service_tier``, ``parallel_tool_calls``, ``stream_options``,
``reasoning_effort``, ``prompt_cache_*``, message ``name``s, Claude's ``thinking`` config and
an assistant message's ``thinking_blocks`` (Anthropic's, signed for Claude alone). Refused
(InvalidRequestError naming the field), because the answer would differ from what was asked:
``logprobs``, ``top_logprobs``, ``logit_bias``, audio, ``web_search_options``, legacy
``functions``/``function_call``, custom tools, images and files that are not ``data:`` URLs, and
tool-call arguments that are not a JSON object.
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.adapters._gemini_to_canonical import (
    JSON,
    GeminiToChatStream,
    chat_usage,
    from_gemini_response,
    split_call_id,
)
from schemas import InvalidRequestError

__all__ = [
    "GeminiToChatStream",
    "chat_usage",
    "from_gemini_response",
    "to_embed_requests",
    "to_gemini_request",
]

_REFUSED = {
    "logprobs": "logprobs: not available from gemini upstreams",
    "top_logprobs": "top_logprobs: not available from gemini upstreams",
    "logit_bias": "logit_bias: not supported by gemini upstreams",
    "audio": "audio: audio output is not supported by gemini upstreams",
    "web_search_options": "web_search_options: not supported by gemini upstreams",
    "functions": "functions: the legacy functions API is not supported; use tools",
    "function_call": "function_call: the legacy functions API is not supported; use tool_choice",
}
_MODES = {"auto": "AUTO", "required": "ANY", "none": "NONE"}
_GENERATION = (
    ("temperature", "temperature"),
    ("top_p", "topP"),
    ("seed", "seed"),
    ("presence_penalty", "presencePenalty"),
    ("frequency_penalty", "frequencyPenalty"),
)
_decode = msgspec.json.Decoder().decode


def to_gemini_request(chat: JSON) -> JSON:
    """Translate a canonical chat request into a ``generateContent`` body.

    Raises InvalidRequestError (``param`` names the field) for what a Gemini upstream cannot
    honour as asked."""
    for key, message in _REFUSED.items():
        if chat.get(key):
            raise InvalidRequestError(message, param=key)
    messages = chat.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages: a non-empty array is required", param="messages")
    system, contents = _contents(messages)
    req: JSON = {"contents": contents}
    if system:
        req["systemInstruction"] = {"parts": [{"text": text} for text in system]}
    if chat.get("tools"):
        req["tools"] = [{"functionDeclarations": _declarations(chat["tools"])}]
        config = _tool_config(chat.get("tool_choice"))
        if config is not None:
            req["toolConfig"] = {"functionCallingConfig": config}
    generation = _generation(chat)
    if generation:
        req["generationConfig"] = generation
    return req


def to_embed_requests(body: JSON, model: str) -> list[JSON]:
    """``batchEmbedContents`` requests, one per input string. Raises InvalidRequestError for
    token-id inputs (Gemini embeds text only)."""
    value = body.get("input")
    inputs = [value] if isinstance(value, str) else value
    if not isinstance(inputs, list) or not inputs or not all(isinstance(v, str) for v in inputs):
        raise InvalidRequestError("input: gemini upstreams embed text (strings)", param="input")
    out: list[JSON] = []
    for text in inputs:
        req: JSON = {"model": f"models/{model}", "content": {"parts": [{"text": text}]}}
        if isinstance(body.get("dimensions"), int):
            req["outputDimensionality"] = body["dimensions"]
        out.append(req)
    return out


def _text_of(content: Any, path: str, join: str = "") -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return join.join(t for t in texts if isinstance(t, str))
    raise InvalidRequestError(f"{path}: must be a string or an array of parts", param=path)


def _user_parts(content: Any, path: str) -> list[JSON]:
    if not isinstance(content, list):
        return [{"text": _text_of(content, path)}]
    parts: list[JSON] = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            parts.append({"text": str(part.get("text") or "")})
        elif kind == "image_url":
            parts.append(_inline(part.get("image_url"), f"{path}[{i}].image_url"))
        elif kind == "file":  # a document (a PDF), which Gemini reads inline as an image
            file = part.get("file")
            data = file.get("file_data") if isinstance(file, dict) else None
            parts.append(_inline(data, f"{path}[{i}].file.file_data"))
        else:
            raise InvalidRequestError(
                f"{path}[{i}]: part type {kind!r} is not supported by gemini upstreams", param=path
            )
    return parts


def _inline(image: Any, path: str) -> JSON:
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        raise InvalidRequestError(
            f"{path}: gemini upstreams take images and files inline (a base64 data: URL)",
            param=path,
        )
    head, _, data = url.partition(";base64,")
    return {"inlineData": {"mimeType": head[len("data:") :], "data": data}}


def _contents(messages: list[Any]) -> tuple[list[str], list[JSON]]:
    system: list[str] = []
    contents: list[JSON] = []
    names: dict[str, str] = {}  # tool call id -> function name, for the results
    for i, msg in enumerate(messages):
        path = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise InvalidRequestError(f"{path}: must be an object", param="messages")
        role = msg.get("role")
        if role in ("system", "developer"):
            # A blank line between a system message's parts, as every other route has them
            # (a Messages client's system blocks are parts when marked for caching).
            system.append(_text_of(msg.get("content"), f"{path}.content", "\n\n"))
            continue
        if role == "user":
            _append(contents, "user", _user_parts(msg.get("content"), f"{path}.content"))
        elif role == "assistant":
            _append(contents, "model", _model_parts(msg, path, names))
        elif role == "tool":
            _append(contents, "user", [_function_response(msg, path, names)])
        else:
            raise InvalidRequestError(f"{path}.role: {role!r} is not supported", param="messages")
    return system, contents


def _append(contents: list[JSON], role: str, parts: list[JSON]) -> None:
    if contents and contents[-1]["role"] == role:
        contents[-1]["parts"].extend(parts)
    else:
        contents.append({"role": role, "parts": parts})


def _model_parts(msg: JSON, path: str, names: dict[str, str]) -> list[JSON]:
    parts: list[JSON] = []
    text = _text_of(msg.get("content"), f"{path}.content")
    if text:
        parts.append({"text": text})
    for j, call in enumerate(msg.get("tool_calls") or ()):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequestError(
                f"{path}.tool_calls[{j}]: only function tool calls are supported", param="messages"
            )
        args = _arguments(fn.get("arguments"), f"{path}.tool_calls[{j}].function.arguments")
        names[str(call.get("id", ""))] = fn["name"]
        part: JSON = {"functionCall": {"name": fn["name"], "args": args}}
        _, signature = split_call_id(str(call.get("id", "")))
        if signature is not None:
            part["thoughtSignature"] = signature
        parts.append(part)
    return parts or [{"text": ""}]


def _arguments(raw: Any, path: str) -> JSON:
    if raw in (None, ""):
        return {}
    try:
        value = _decode(raw) if isinstance(raw, str | bytes) else raw
    except msgspec.DecodeError:
        value = None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{path}: must be a JSON object", param="messages")
    return value


def _function_response(msg: JSON, path: str, names: dict[str, str]) -> JSON:
    call_id = str(msg.get("tool_call_id", ""))
    name = names.get(call_id)
    if name is None:
        raise InvalidRequestError(
            f"{path}.tool_call_id: answers no earlier tool call", param="messages"
        )
    text = _text_of(msg.get("content"), f"{path}.content")
    try:
        value = _decode(text)
    except msgspec.DecodeError:
        value = None
    # Gemini takes an object as a function's result; anything else is wrapped.
    response = value if isinstance(value, dict) else {"result": text}
    return {"functionResponse": {"name": name, "response": response}}


def _declarations(tools: Any) -> list[JSON]:
    out: list[JSON] = []
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(fn, dict):
            raise InvalidRequestError(
                f"tools[{i}]: only function tools are supported by gemini upstreams", param="tools"
            )
        decl: JSON = {"name": fn.get("name")}
        if fn.get("description"):
            decl["description"] = fn["description"]
        if fn.get("parameters"):
            decl["parametersJsonSchema"] = fn["parameters"]
        out.append(decl)
    return out


def _tool_config(choice: Any) -> JSON | None:
    if isinstance(choice, str) and choice in _MODES:
        return {"mode": _MODES[choice]}
    fn = choice.get("function") if isinstance(choice, dict) else None
    if isinstance(fn, dict) and isinstance(fn.get("name"), str):
        return {"mode": "ANY", "allowedFunctionNames": [fn["name"]]}
    return None


def _generation(chat: JSON) -> JSON:
    config: JSON = {}
    max_tokens = chat.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = chat.get("max_tokens")
    if max_tokens is not None:
        config["maxOutputTokens"] = max_tokens
    for key, name in _GENERATION:
        if chat.get(key) is not None:
            config[name] = chat[key]
    if chat.get("n") not in (None, 1):
        config["candidateCount"] = chat["n"]
    stop = chat.get("stop")
    if isinstance(stop, str):
        config["stopSequences"] = [stop]
    elif isinstance(stop, list) and stop:
        config["stopSequences"] = stop
    fmt = chat.get("response_format")
    if not isinstance(fmt, dict):
        return config
    kind = fmt.get("type")
    if kind in ("json_object", "json_schema"):
        config["responseMimeType"] = "application/json"
        schema = (fmt.get("json_schema") or {}).get("schema") if kind == "json_schema" else None
        if isinstance(schema, dict):
            config["responseJsonSchema"] = schema
    return config
