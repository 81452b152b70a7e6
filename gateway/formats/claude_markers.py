"""The private markers the Messages surface (``anthropic_messages``) sets on a canonical
request for what only Claude reads. An ``anthropic`` route (and Claude on Bedrock, where
Converse has the field) acts on them; every other route drops them, as its provider refuses
fields it does not know. The keys themselves are defined in ``schemas.canonical_markers``,
which the adapters import too.
"""

from __future__ import annotations

from typing import Any

from schemas.canonical_markers import (
    ANTHROPIC_BETA,
    CLAUDE_CACHE,
    CLAUDE_NATIVE,
    CLAUDE_STOP_REASON,
    CLAUDE_THINKING,
    TOOL_ERROR_PREFIX,
)

__all__ = [
    "ANTHROPIC_BETA",
    "CLAUDE_CACHE",
    "CLAUDE_NATIVE",
    "CLAUDE_STOP_REASON",
    "CLAUDE_THINKING",
    "TOOL_ERROR_PREFIX",
    "claude_native",
]


def claude_native(body: dict[str, Any]) -> dict[str, Any]:
    """The :data:`CLAUDE_NATIVE` object of a Messages request ``body`` (translated before,
    without error: its types are checked)."""
    native: dict[str, Any] = {}
    for key in ("top_k", "context_management"):
        if (value := body.get(key)) is not None:
            native[key] = value
    errors = [
        block["tool_use_id"]
        for message in body["messages"]
        if type(message["content"]) is list
        for block in message["content"]
        if block["type"] == "tool_result" and block.get("is_error") is True
    ]
    if errors:
        native["tool_errors"] = errors
    return native
