"""What a simulated provider answers, in its wire shapes: how many tokens a request's body
carries, the tool it is asked to call, the chunks and usage of an answer, and the errors a
provider sends (through the same ``error_from_status`` as a real HTTP answer)."""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.adapters.base import JSON, error_from_status
from schemas import UpstreamError
from schemas.config import credential_id

CHARS_PER_TOKEN = 4
"""The prompt a trace request carries is this many characters per token (the gateway's own
estimate divides by the same)."""

_encode = msgspec.json.Encoder().encode

IMAGE_TOKENS = 85
"""The prompt tokens a simulated provider bills per image (a low-detail image's price)."""


def prompt_tokens_of(body: JSON) -> int:
    """The prompt tokens a request carries: its messages' text and its tool definitions'
    JSON length / CHARS_PER_TOKEN, plus IMAGE_TOKENS per image."""
    chars = images = 0
    for m in body.get("messages") or ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text" and isinstance(part.get("text"), str):
                    chars += len(part["text"])
                elif kind == "image_url":
                    images += 1
    tools = body.get("tools")
    if tools:
        chars += len(_encode(tools))
    return max(1, chars // CHARS_PER_TOKEN + images * IMAGE_TOKENS)


def called_tool(body: JSON) -> str | None:
    """The tool the answer calls: the named one of ``tool_choice``, or the first tool when
    ``tool_choice`` is ``required`` (None: the answer is text)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not tools or not isinstance(tools, list):
        return None
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        return str(name) if name else None
    if choice == "required":
        first = tools[0].get("function") if isinstance(tools[0], dict) else None
        return str(first.get("name") or "tool") if isinstance(first, dict) else "tool"
    return None


def asked_tokens_of(body: JSON) -> int | None:
    """The longest answer the request allows: its ``max_tokens`` (what a provider reserves of
    a token limit while it answers); None when it sets none."""
    n = body.get("max_completion_tokens") or body.get("max_tokens")
    return None if n is None else max(1, int(n))


def output_tokens_of(body: JSON) -> int:
    """The answer's length: the number the prompt opens with (a trace request whose client
    sets a cap of its own, or none), else the request's ``max_tokens`` (the trace sets it to
    the length); never more than ``max_tokens``."""
    asked = asked_tokens_of(body)
    messages = body.get("messages") or ()
    content = messages[0].get("content") if messages and isinstance(messages[0], dict) else None
    if isinstance(content, list) and content and isinstance(content[0], dict):
        content = content[0].get("text")
    if isinstance(content, str) and content[:1].isdigit():
        head = content.split(" ", 1)[0]
        if head.isdigit():
            return max(1, int(head) if asked is None else min(asked, int(head)))
    return 1 if asked is None else asked


def text_delta(text: str) -> dict[str, Any]:
    """A text answer's next delta."""
    return {"content": text}


def arguments_delta(text: str) -> dict[str, Any]:
    """A tool call's next delta: more of its arguments."""
    return {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}


def tool_arguments(output: int) -> str:
    """A tool call's arguments about ``output`` tokens long (JSON)."""
    return '{"query": "' + "x" * max(1, output) + '"}'


def usage(prompt: int, output: int) -> dict[str, Any]:
    """An answer's usage block."""
    return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}


def refused(keys: tuple[str, ...], credential: str) -> bool:
    """Whether the providers file refuses ``credential`` (named as written, or by its id)."""
    return credential in keys or credential_id(credential) in keys


def too_many(endpoint: str, retry_after: float | None) -> UpstreamError:
    """The 429 of a concurrency plan already at its limit."""
    headers = {"retry-after": f"{retry_after:g}"} if retry_after is not None else {}
    message = "Too many concurrent requests for your plan"
    body = _encode({"error": {"message": message, "type": "concurrency_limit_exceeded"}})
    return error_from_status(endpoint, 429, headers, body)


def failure(endpoint: str, kind: str) -> UpstreamError:
    """The UpstreamError a real adapter raises for ``kind``."""
    if kind.startswith("http_"):
        status = int(kind[5:])
        body = _encode({"error": {"message": f"simulated {status}"}})
        return error_from_status(endpoint, status, {}, body)
    if kind == "connect":
        return UpstreamError("upstream connection failed (simulated)", endpoint=endpoint, kind=kind)
    return UpstreamError(
        "upstream connection reset (simulated)", endpoint=endpoint, kind="transport"
    )


def quota_spent(endpoint: str) -> UpstreamError:
    """The 429 ``insufficient_quota`` of a spent quota plan (no Retry-After: a provider does
    not say when a plan renews)."""
    message = "You exceeded your current quota, please check your plan and billing."
    error = {"message": message, "type": "insufficient_quota", "code": "insufficient_quota"}
    return error_from_status(endpoint, 429, {}, _encode({"error": error}))
