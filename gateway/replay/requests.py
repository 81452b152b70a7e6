"""What a trace request looks like on the wire: the chat body and the ASGI scope the replay
sends through the gateway's ingress for it (``chat_scope``, which the request-cost benchmark
drives the ingress with too)."""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.replay.answers import CHARS_PER_TOKEN

if TYPE_CHECKING:
    from gateway.replay.trace import TraceRequest

_encode = msgspec.json.Encoder().encode


def request_body(r: TraceRequest) -> bytes:
    """The chat request ``r`` stands for: a prompt of its length (then its images), its
    answer's length as ``max_tokens`` (or its client's cap, none for 0, the prompt then
    opening with the length, which the simulated model reads: :func:`output_tokens_of`), its
    tool definitions (and ``tool_choice: required`` when its answer is a tool call)."""
    length = "" if r.max_tokens is None else f"{r.output_tokens} "
    text = length + "x" * max(0, r.prompt_tokens * CHARS_PER_TOKEN - len(length))
    content: str | list[dict[str, Any]] = text
    if r.images:
        content = [{"type": "text", "text": text}] + [
            {"type": "image_url", "image_url": {"url": f"https://images.sim/{r.id}/{i}.png"}}
            for i in range(r.images)
        ]
    body: dict[str, Any] = {
        "model": r.model,
        "messages": [{"role": "user", "content": content}],
        "stream": r.stream,
    }
    if r.max_tokens != 0:
        body["max_tokens"] = r.output_tokens if r.max_tokens is None else r.max_tokens
    if r.tools:
        body["tools"] = [_tool(i) for i in range(r.tools)]
        if r.tool_call:
            body["tool_choice"] = "required"
    if r.stream:
        body["stream_options"] = {"include_usage": True}
    return _encode(body)


def request_scope(r: TraceRequest, secret: str | None) -> dict[str, Any]:
    """The ASGI scope of ``r``: its caller is its client address (what affinity keys on for
    an anonymous caller); ``secret`` is its gateway API key's (affinity's key then)."""
    n = zlib.crc32(r.caller.encode())
    headers = [(b"content-type", b"application/json")]
    if secret is not None:
        headers.append((b"authorization", b"Bearer " + secret.encode()))
    if r.labels:
        headers.append((b"x-llmgw-metadata", _encode(r.labels)))
    return chat_scope(headers, (f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}", 40000))


def chat_scope(headers: list[tuple[bytes, bytes]], client: tuple[str, int]) -> dict[str, Any]:
    """The ASGI scope an HTTP/1.1 server hands the ingress's app for a ``POST
    /v1/chat/completions`` from ``client`` with ``headers``: for driving the app in-process
    (the replay, and the request-cost benchmark)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": client,
        "server": ("127.0.0.1", 8080),
    }


def _tool(i: int) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "A tool of the replay's synthetic traffic.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}},
                "required": ["query"],
            },
        },
    }
