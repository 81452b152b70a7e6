"""OpenAI embeddings client surface (``POST /v1/embeddings``): what a request must be.

The body goes upstream as it is (every embeddings upstream speaks this shape), so the
check here is all the translation there is.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from gateway.formats.openai_chat import (
    INTEGER,
    JSON,
    STRING,
    check_types,
    require_object_with_model,
)
from schemas import InvalidRequestError
from schemas.keys import shown

# The documented fields (openai's EmbeddingCreateParams) besides model and input.
_FIELDS = {"dimensions": INTEGER, "encoding_format": STRING, "user": STRING}
_ENCODINGS = ("float", "base64")
MAX_INPUTS = 2048
"""The most inputs one request may hold (OpenAI's limit: it refuses a longer array)."""


def validate_embeddings_request(raw: Any) -> JSON:
    """``body`` if it is an embeddings request. Raises InvalidRequestError naming the field
    (a mistyped one, a malformed ``input``: empty, an empty string or token array, over
    :data:`MAX_INPUTS` inputs; an ``encoding_format`` that is not ``float`` or ``base64``).
    OpenAI refuses each of these with a 400: refused here, no upstream is asked."""
    body = require_object_with_model(raw)
    inp = body.get("input")
    if not (isinstance(inp, str | list) and inp):
        raise InvalidRequestError(
            "input: must be a non-empty string or a non-empty array", param="input"
        )
    if isinstance(inp, list):
        _check_inputs(inp)
    check_types(body, _FIELDS)
    encoding = body.get("encoding_format")
    if encoding is not None and encoding not in _ENCODINGS:
        # Relayed, an upstream would answer it in its own way, or as floats (the adapters
        # that encode give base64 only when asked): the client's SDK could not decode it.
        raise InvalidRequestError(
            f"encoding_format: must be 'float' or 'base64', not {shown(encoding)}",
            param="encoding_format",
        )
    return body


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and value != ""


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_tokens(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(map(_is_token, value))


_Text = Annotated[str, msgspec.Meta(min_length=1)]
_Token = Annotated[int, msgspec.Meta(ge=0)]
_Tokens = Annotated[list[_Token], msgspec.Meta(min_length=1)]
# An array ``input`` holds one of these kinds throughout (with a string, the API's 4 forms):
# the first item's is found in Python, the whole array checked in msgspec's C (a Python call
# per token cost about 11 ms for 16 inputs of 8,000 tokens), and only an array that fails it
# walked again to name the item.
_INPUT_KINDS = (
    (_is_text, list[_Text], "a non-empty string"),
    (_is_token, list[_Token], "a token id (an integer from 0)"),
    (_is_tokens, list[_Tokens], "a non-empty array of token ids"),
)


def _check_inputs(inputs: list[Any]) -> None:
    """Raise InvalidRequestError naming the first item of ``inputs`` not of ``input[0]``'s
    kind (or ``input[0]`` when it is of none), or ``input`` when it holds too many inputs."""
    found = next(((f, t, k) for f, t, k in _INPUT_KINDS if f(inputs[0])), None)
    if found is None:
        kinds = ", ".join(k for _, _, k in _INPUT_KINDS)
        raise InvalidRequestError(f"input[0]: must be one of {kinds}", param="input[0]")
    fits, array, kind = found
    if fits is not _is_token and len(inputs) > MAX_INPUTS:
        # A flat token array is one input (its length is tokens, the model's limit).
        raise InvalidRequestError(
            f"input: must hold at most {MAX_INPUTS} inputs, not {len(inputs)}", param="input"
        )
    try:
        msgspec.convert(inputs, array)
    except msgspec.ValidationError:
        pass
    else:
        return
    for i, item in enumerate(inputs):
        if not fits(item):
            raise InvalidRequestError(
                f"input[{i}]: must be {kind}, as the first item is", param=f"input[{i}]"
            )


def embeddings_estimate(body: JSON) -> int:
    """The prompt tokens of an embeddings request (validated), as the gateway estimates when
    an upstream reports none: a token array's tokens counted, a string's at 4 bytes of UTF-8
    a token (the chat estimate's rule, on the text rather than on its JSON), at least one."""
    inp = body.get("input")
    items = inp if isinstance(inp, list) and not isinstance(inp[0], int) else [inp]
    tokens = 0
    for item in items:
        if isinstance(item, str):
            tokens += max(1, -(-len(item.encode()) // 4))
        elif isinstance(item, list):
            tokens += len(item)
    return tokens


def shown_usage(answer: JSON, estimate: int) -> JSON:
    """``answer`` as the client sees it: its ``usage`` as OpenAI's is (``prompt_tokens`` and
    ``total_tokens``, required), the ``estimate`` (what it is billed on) when the upstream
    reported none. ``answer`` itself is left as it is: billing reads it."""
    usage = answer.get("usage")
    if isinstance(usage, dict) and type(usage.get("prompt_tokens")) is int:
        if type(usage.get("total_tokens")) is int:
            return answer
        return {**answer, "usage": {**usage, "total_tokens": usage["prompt_tokens"]}}
    return {**answer, "usage": {"prompt_tokens": estimate, "total_tokens": estimate}}
