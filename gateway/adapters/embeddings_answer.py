"""What an embeddings answer in the OpenAI shape must be before a client sees it (pure).

The OpenAI API's ``data`` holds one embedding per input, each naming its input by ``index``,
and the API documents that their order is not guaranteed; clients read it in order (LangChain,
LlamaIndex, Chroma's and most embedders zip it with their inputs), so an upstream answering
out of order silently gave each text another text's vector. LiteLLM sorts by ``index``; so
does the seam here, for every adapter. An answer whose ``data`` is not one embedding per input
(too few, too many, an ``index`` repeated or out of range) is the upstream's bad response.

Each embedding is also put in the encoding the request asked (``encoding_format``: ``base64``,
the little-endian float32 bytes OpenAI sends, or ``float``, its default): a compatible server
that ignores the field answers floats to a client that asked base64 (whose decoding of them
failed), and one that always answers base64 a client that asked floats.
"""

from __future__ import annotations

import array
import base64
import binascii
import sys
from typing import Any

__all__ = ["answer_problem", "encoding_problem", "inputs_of", "order_problem"]


def answer_problem(answer: dict[str, Any], body: Any) -> str | None:
    """Put an embeddings ``answer`` to request ``body`` in its shape (in place: see
    :func:`order_problem`, :func:`encoding_problem`); how it breaks it instead, or None."""
    return order_problem(answer, inputs_of(body)) or encoding_problem(answer, body)


def inputs_of(body: Any) -> int:
    """How many embeddings an embeddings request asks for: one per string or token array in
    an array ``input``, one for a string or a single token array."""
    inp = body.get("input") if isinstance(body, dict) else None
    if isinstance(inp, list) and inp and not isinstance(inp[0], int):
        return len(inp)
    return 1


def order_problem(answer: dict[str, Any], inputs: int) -> str | None:
    """Put ``answer["data"]`` in input order by each item's ``index`` (in place; an item
    without one keeps its place); how it breaks the shape instead, or None."""
    data = answer.get("data")
    if type(data) is not list:
        return "its 'data' is not an array"
    if len(data) != inputs:
        return f"{len(data)} embeddings for {inputs} inputs"
    ordered: list[Any] = [None] * inputs
    for position, item in enumerate(data):
        if type(item) is not dict:
            return "an embedding is not an object"
        index = item.get("index", position)
        if type(index) is not int or not 0 <= index < inputs or ordered[index] is not None:
            return f"an embedding's index is not one of its inputs' ({index!r})"
        ordered[index] = item
    answer["data"] = ordered
    return None


def encoding_problem(answer: dict[str, Any], body: Any) -> str | None:
    """Put each embedding of ``answer["data"]`` (in input order already: see
    :func:`order_problem`) in the encoding ``body`` asked, in place; how one breaks the shape
    instead (neither an array of numbers nor base64 of float32 bytes), or None."""
    as_base64 = isinstance(body, dict) and body.get("encoding_format") == "base64"
    for item in answer["data"]:
        vector = item.get("embedding")
        converted: str | list[float] | None
        if type(vector) is list:
            if not as_base64:
                continue
            converted = _packed(vector)
        elif type(vector) is str:
            if as_base64:
                continue
            converted = _unpacked(vector)
        else:
            return "an embedding is neither an array of numbers nor base64"
        if converted is None:
            return "an embedding is not " + ("an array of numbers" if as_base64 else "base64")
        item["embedding"] = converted
    return None


def _packed(vector: list[Any]) -> str | None:
    """``vector`` as OpenAI's base64 (little-endian float32); None when it is not numbers."""
    if any(type(v) not in (float, int) for v in vector):
        return None
    try:
        floats = array.array("f", vector)
    except OverflowError:  # an int past any float (400 digits): a 500 once
        return None
    if sys.byteorder == "big":
        floats.byteswap()
    return base64.b64encode(floats.tobytes()).decode()


def _unpacked(text: str) -> list[float] | None:
    """OpenAI's base64 ``text`` as the floats it packs; None when it packs none."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if not raw or len(raw) % 4:
        return None
    floats = array.array("f", raw)
    if sys.byteorder == "big":
        floats.byteswap()
    return floats.tolist()
