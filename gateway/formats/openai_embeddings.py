"""OpenAI embeddings client surface (``POST /v1/embeddings``): what a request must be.

The body goes upstream as it is (every embeddings upstream speaks this shape), so the
check here is all the translation there is.
"""

from __future__ import annotations

from typing import Any

from gateway.formats.openai_chat import (
    INTEGER,
    JSON,
    STRING,
    check_types,
    require_object_with_model,
)
from schemas import InvalidRequestError

# The documented fields (openai's EmbeddingCreateParams) besides model and input.
_FIELDS = {"dimensions": INTEGER, "encoding_format": STRING, "user": STRING}


def validate_embeddings_request(raw: Any) -> JSON:
    """``body`` if it is an embeddings request. Raises InvalidRequestError naming the field."""
    body = require_object_with_model(raw)
    inp = body.get("input")
    if not (isinstance(inp, str) or (isinstance(inp, list) and inp)):
        raise InvalidRequestError("'input' must be a string or a non-empty array", param="input")
    check_types(body, _FIELDS)
    return body
