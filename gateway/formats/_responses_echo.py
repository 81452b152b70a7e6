"""What a Responses answer echoes of its request: each setting as the request gave it, and
one it left out as OpenAI's API echoes it (its answer to a bare ``{"model", "input"}``), so a
client reading ``response.temperature`` reads what it would read from OpenAI."""

from __future__ import annotations

from typing import Any

from gateway.formats._common import JSON, new_id

__all__ = ["response_shell", "served_tier"]


def response_shell(model: str, request: JSON | None, created_at: int) -> JSON:
    """An ``in_progress`` response with no output that echoes the request's settings, each
    one the request left out as OpenAI echoes it: ``temperature`` and ``top_p`` 1.0,
    ``metadata`` ``{}``, ``reasoning`` ``{"effort": null, "summary": null}``, ``text``
    ``{"format": {"type": "text"}, "verbosity": "medium"}``, ``tool_choice`` ``auto``,
    ``store`` true, ``service_tier`` ``default`` (the tier that served, an upstream's answer
    may correct it), ``truncation`` ``disabled``, ``top_logprobs`` 0."""
    req = request or {}
    parallel = req.get("parallel_tool_calls")
    store = req.get("store")
    return {
        "id": new_id("resp_"),
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": _str_or_none(req.get("instructions")),
        "max_output_tokens": _int_or_none(req.get("max_output_tokens")),
        "max_tool_calls": _int_or_none(req.get("max_tool_calls")),
        "model": model,
        "output": [],
        "parallel_tool_calls": parallel if isinstance(parallel, bool) else True,
        "previous_response_id": None,
        "prompt_cache_key": _str_or_none(req.get("prompt_cache_key")),
        "prompt_cache_retention": _str_or_none(req.get("prompt_cache_retention")),
        "reasoning": {**_REASONING, **_dict_or_empty(req.get("reasoning"))},
        "safety_identifier": _str_or_none(req.get("safety_identifier")),
        "service_tier": _tier(req.get("service_tier")) or "default",
        "store": store if isinstance(store, bool) else True,
        "temperature": _number_or(req.get("temperature"), 1.0),
        "text": {**_TEXT, **_given(req.get("text"))},
        "tool_choice": req.get("tool_choice") or "auto",
        "tools": list(req.get("tools") or ()),
        "top_logprobs": _int_or_none(req.get("top_logprobs")) or 0,
        "top_p": _number_or(req.get("top_p"), 1.0),
        "truncation": req.get("truncation") if req.get("truncation") == "auto" else "disabled",
        "usage": None,
        "user": _str_or_none(req.get("user")),
        "metadata": _dict_or_empty(req.get("metadata")),
    }


# What OpenAI echoes for a request's ``reasoning`` and ``text`` settings left out (a
# request's own keys replace these, a ``text`` that gives only its verbosity keeps the format).
_REASONING: JSON = {"effort": None, "summary": None}
_TEXT: JSON = {"format": {"type": "text"}, "verbosity": "medium"}


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int_or_none(value: Any) -> int | None:
    return value if type(value) is int else None


def _number_or(value: Any, default: float) -> float:
    return value if type(value) in (int, float) else default


def _dict_or_empty(value: Any) -> JSON:
    return value if isinstance(value, dict) else {}


def _given(value: Any) -> JSON:
    """The keys of ``value`` (a dict, else none) that are not null."""
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else {}


def served_tier(answer: JSON) -> str | None:
    """The service tier a chat ``answer`` or chunk says served it, if it says one."""
    return _tier(answer.get("service_tier"))


def _tier(value: Any) -> str | None:
    """The service tier ``value`` names (``auto`` names none: OpenAI shows the one used)."""
    return value if isinstance(value, str) and value and value != "auto" else None
