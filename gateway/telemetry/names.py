"""GenAI semantic-convention names shared by spans and metrics (no SDK import)."""

from __future__ import annotations

_PROVIDERS = {"openai_compat": "openai", "anthropic": "anthropic", "echo": "llmgw.echo"}
_OPERATIONS = {"embeddings": "embeddings"}  # every other surface is a chat operation


def provider_name(kind: str) -> str:
    """``gen_ai.provider.name`` of an upstream kind (a config value)."""
    return _PROVIDERS.get(kind, kind)


def operation_name(surface: str) -> str:
    """``gen_ai.operation.name`` of a client surface (chat, responses, messages: ``chat``)."""
    return _OPERATIONS.get(surface, "chat")
