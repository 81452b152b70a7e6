"""Bedrock embeddings: the canonical (OpenAI) embeddings request <-> ``InvokeModel`` bodies.

Bedrock has no one embeddings API: ``InvokeModel`` takes the model's own body, so the model id
prefix chooses it. Amazon Titan Text Embeddings (``amazon.titan-embed-text-*``) embeds one
``inputText`` per call (``dimensions`` passed through); Cohere Embed (``cohere.embed-*``)
takes up to 96 ``texts`` per call. Pure functions: no I/O.
"""

from __future__ import annotations

import array
import base64
from typing import TYPE_CHECKING, Any

import msgspec

from schemas import InvalidRequestError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.adapters.base import JSON

__all__ = [
    "EMBED_FAMILIES",
    "TOKEN_COUNT_HEADER",
    "InvokeCall",
    "embedding_answer",
    "family_of",
    "invoke_calls",
    "tokens_of",
    "vectors_of",
]

EMBED_FAMILIES = {"amazon.titan-embed-text": "titan", "cohere.embed": "cohere"}
"""Model id prefix -> the body family that embeds with it."""
_COHERE_BATCH = 96  # Cohere Embed's most texts per call
TOKEN_COUNT_HEADER = "x-amzn-bedrock-input-token-count"


class InvokeCall:
    """One ``InvokeModel`` body and how many of the inputs it embeds."""

    __slots__ = ("body", "count")

    def __init__(self, body: JSON, count: int) -> None:
        self.body = body
        self.count = count


def family_of(model: str) -> str | None:
    """``titan`` or ``cohere`` for a model id (an inference-profile region prefix such as
    ``us.`` allowed), else None."""
    for prefix, family in EMBED_FAMILIES.items():
        if model.startswith(prefix) or model.partition(".")[2].startswith(prefix):
            return family
    return None


def invoke_calls(body: JSON, model: str) -> list[InvokeCall]:
    """The InvokeModel bodies embedding ``body``'s inputs, in order. Raises
    InvalidRequestError: a model of no known family, non-text inputs, an option the family
    has not."""
    family = family_of(model)
    if family is None:
        known = ", ".join(f"{p}*" for p in EMBED_FAMILIES)
        raise InvalidRequestError(
            f"model: bedrock embeddings are served for {known}; {model!r} is not one",
            param="model",
        )
    texts = _texts(body.get("input"))
    dims = body.get("dimensions")
    if family == "titan":
        extra = {} if dims is None else {"dimensions": dims}
        return [InvokeCall({"inputText": text, **extra}, 1) for text in texts]
    if dims is not None:
        raise InvalidRequestError(
            "dimensions: Cohere Embed on bedrock has a fixed dimension", param="dimensions"
        )
    return [
        InvokeCall(
            {"texts": texts[i : i + _COHERE_BATCH], "input_type": "search_document"},
            len(texts[i : i + _COHERE_BATCH]),
        )
        for i in range(0, len(texts), _COHERE_BATCH)
    ]


def vectors_of(answer: Any, call: InvokeCall) -> list[list[float]] | None:
    """The vectors one InvokeModel answer carries for ``call``, or None when the answer is
    not the family's shape (or has not one vector of numbers per input)."""
    if type(answer) is not dict:
        return None
    if "inputText" in call.body:
        vector = answer.get("embedding")
        vectors = [vector] if isinstance(vector, list) else None
    else:
        found = answer.get("embeddings")
        if isinstance(found, dict):  # embedding_types asked: {"float": [[...]], ...}
            found = found.get("float")
        vectors = found if isinstance(found, list) else None
    if vectors is None or len(vectors) != call.count:
        return None
    try:  # a "0.1" or a true among the numbers is no vector (and failed the base64 packing)
        return msgspec.convert(vectors, list[list[float]])
    except msgspec.ValidationError:
        return None


def tokens_of(answer: Any, headers: Mapping[str, str]) -> int | None:
    """The input tokens one answer reports: Titan's ``inputTextTokenCount``, else Bedrock's
    ``X-Amzn-Bedrock-Input-Token-Count`` header, else 0; None (unknown) when the one it
    reports is not a whole number from 0."""
    count = answer.get("inputTextTokenCount") if type(answer) is dict else None
    if count is None:
        try:
            count = int(headers.get(TOKEN_COUNT_HEADER, "0"))
        except ValueError:
            return None
    return count if type(count) is int and count >= 0 else None


def embedding_answer(
    vectors: list[list[float]], *, model: str, tokens: int | None, as_base64: bool
) -> JSON:
    """The canonical (OpenAI) embeddings answer; ``as_base64`` packs each vector as
    little-endian float32, as OpenAI's ``encoding_format: base64`` does. ``tokens`` None:
    the usage is unknown."""
    data = [
        {
            "object": "embedding",
            "index": index,
            "embedding": (
                base64.b64encode(array.array("f", vector).tobytes()).decode()
                if as_base64
                else vector
            ),
        }
        for index, vector in enumerate(vectors)
    ]
    usage = None if tokens is None else {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise InvalidRequestError(
        "input: bedrock upstreams embed text (a string or a list of strings)", param="input"
    )
