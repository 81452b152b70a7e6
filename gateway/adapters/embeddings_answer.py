"""What an embeddings answer in the OpenAI shape must be before a client sees it (pure).

The OpenAI API's ``data`` holds one embedding per input, each naming its input by ``index``,
and the API documents that their order is not guaranteed; clients read it in order (LangChain,
LlamaIndex, Chroma's and most embedders zip it with their inputs), so an upstream answering
out of order silently gave each text another text's vector. LiteLLM sorts by ``index``; so
does the seam here, for every adapter. An answer whose ``data`` is not one embedding per input
(too few, too many, an ``index`` repeated or out of range) is the upstream's bad response.
"""

from __future__ import annotations

from typing import Any

__all__ = ["inputs_of", "order_problem"]


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
