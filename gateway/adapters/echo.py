"""``echo``: the built-in demo upstream. Answers locally, streaming too, with no network."""

from __future__ import annotations

import array
import base64
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from gateway.adapters.base import JSON, Batch, UpstreamTarget


def _last_user_text(body: JSON) -> str:
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(
                    str(p.get("text", "")) for p in content
                    if isinstance(p, dict) and p.get("type") == "text"
                )
    return ""


def _usage(body: JSON, text: str) -> dict[str, Any]:
    prompt = sum(len(str(m.get("content", "")).split()) for m in body.get("messages") or []
                 if isinstance(m, dict))
    completion = len(text.split())
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


class EchoAdapter:
    """Echoes the last user message back as ``echo: <text>``."""

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """A chat.completion whose content echoes the caller."""
        text = f"echo: {_last_user_text(body)}"
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": target.upstream_model or str(body.get("model", "echo")),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": "stop", "logprobs": None}],
            "usage": _usage(body, text),
        }

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """The same answer as chunks, one per batch (as a slow upstream would send them):
        role, one chunk per word, finish, usage if asked."""
        text = f"echo: {_last_user_text(body)}"
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": target.upstream_model or str(body.get("model", "echo")),
        }
        chunks: list[JSON] = [{**base, "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}]
        for i, word in enumerate(text.split(" ")):
            piece = word if i == 0 else " " + word
            chunks.append({**base, "choices": [{"index": 0, "delta": {"content": piece},
                                                "finish_reason": None}]})
        chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        opts = body.get("stream_options")
        if isinstance(opts, dict) and opts.get("include_usage"):
            chunks.append({**base, "choices": [], "usage": _usage(body, text)})
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
            embedding: Any = (base64.b64encode(array.array("f", vec).tobytes()).decode()
                              if as_base64 else vec)
            data.append({"object": "embedding", "index": i, "embedding": embedding})
        tokens = sum(len(str(x).split()) for x in items)
        return {"object": "list", "data": data, "model": target.upstream_model or "echo",
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
