"""Upstream adapters: the canonical (OpenAI chat) shape <-> each upstream kind's wire.

The wire translations are pure (no I/O) and import only the stdlib, msgspec and
``schemas``; the HTTP calls around them use a pooled client handed in by the ingress.

- ``anthropic_wire``: kind ``anthropic``, the native Anthropic Messages wire
- ``azure_openai``: kind ``azure_openai``, the OpenAI wire at Azure deployment URLs
- ``gemini_wire``: kind ``gemini``, the Gemini API's native generateContent wire
- ``bedrock_wire``, ``bedrock_stream``: kind ``bedrock``, AWS Bedrock Converse and
  ConverseStream (``bedrock`` signs with botocore's SigV4, ``bedrock_auth``);
  ``bedrock_embed``: its embeddings, InvokeModel bodies for Titan and Cohere Embed
"""

from __future__ import annotations

from gateway.adapters import anthropic_wire
from gateway.adapters.anthropic_wire import (
    DEFAULT_MAX_TOKENS,
    MessagesToChatStream,
    UpstreamStreamError,
    from_messages_response,
    to_messages_request,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MessagesToChatStream",
    "UpstreamStreamError",
    "anthropic_wire",
    "from_messages_response",
    "to_messages_request",
]
