"""What ``POST /v1/embeddings`` accepts as ``input``: what OpenAI refuses with a 400 (an empty
string, array or token array, a token id not an integer from 0, over 2048 inputs) is refused
naming the input, and what it serves passes as sent."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.formats.openai_embeddings import MAX_INPUTS, validate_embeddings_request
from schemas import InvalidRequestError


@pytest.mark.parametrize(
    ("inp", "param"),
    [
        ("", "input"),
        ([], "input"),
        ([""], "input[0]"),
        (["a", ""], "input[1]"),
        ([[]], "input[0]"),
        ([[1], []], "input[1]"),
        ([1.5], "input[0]"),
        ([1, "2"], "input[1]"),
        ([[1, 2.0]], "input[0]"),
        ([-1], "input[0]"),
        (["a"] * (MAX_INPUTS + 1), "input"),
        ([[1]] * (MAX_INPUTS + 1), "input"),
    ],
    ids=[
        "empty string",
        "empty array",
        "only an empty string",
        "an empty string among texts",
        "an empty token array",
        "an empty token array among token arrays",
        "a float token",
        "a string token",
        "a float in a token array",
        "a negative token",
        "too many texts",
        "too many token arrays",
    ],
)
def test_an_input_openai_refuses_is_refused_naming_it(inp: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        validate_embeddings_request({"model": "m", "input": inp})
    assert info.value.param == param
    assert str(info.value).startswith(param)


@pytest.mark.parametrize(
    "inp",
    ["a", ["a"] * MAX_INPUTS, [[1, 2]] * MAX_INPUTS, list(range(MAX_INPUTS + 1)), [0]],
    ids=["text", "most texts", "most token arrays", "one long token array", "token zero"],
)
def test_an_input_openai_serves_passes_as_sent(inp: Any) -> None:
    assert validate_embeddings_request({"model": "m", "input": inp})["input"] is inp
