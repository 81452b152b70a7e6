"""Client wire formats: each client API shape <-> the canonical (OpenAI chat) shape.

One module per client surface, each pure (no I/O) and importing only the stdlib, msgspec and
``schemas``. A module translates the request to canonical chat (``to_chat_request``), the
canonical answer back (``from_chat_response``), canonical stream chunks into the client's
SSE frames (a ``ChatTo*Stream`` with ``feed``/``finish``/``error``), and renders errors in
the client's own shape (``error_body``). The function names repeat across modules, so
callers import the module: ``from gateway.formats import anthropic_messages``.

- ``anthropic_messages``: ``POST /v1/messages`` (Anthropic Messages)
- ``openai_responses``: ``POST /v1/responses`` (OpenAI Responses)
"""

from __future__ import annotations

from gateway.formats import anthropic_messages, openai_responses
from gateway.formats.anthropic_messages import ChatToMessagesStream
from gateway.formats.openai_responses import ChatToResponsesStream

__all__ = [
    "ChatToMessagesStream",
    "ChatToResponsesStream",
    "anthropic_messages",
    "openai_responses",
]
