"""gateway.adapters.embeddings_answer and the embeddings usage a client sees
(gateway.formats.openai_embeddings): each embedding in the ``encoding_format`` asked, whatever
the upstream answered, and OpenAI's required ``usage`` when the upstream gave none.

Encodings are proven with the official ``openai`` SDK's own base64 decoding.
"""

from __future__ import annotations

import array
import base64
from typing import Any

import pytest
from openai import omit
from openai.lib._parsing._embeddings import parse_embedding_response
from openai.types import CreateEmbeddingResponse

from gateway.adapters.embeddings_answer import encoding_problem
from gateway.formats.openai_embeddings import embeddings_estimate, shown_usage

VECTORS = ([0.5, -0.25, 1.0], [0.125, 2.0, -3.5])  # exact in float32
PACKED = [base64.b64encode(array.array("f", v).tobytes()).decode() for v in VECTORS]


def _answer(embeddings: list[Any], usage: Any = None) -> dict[str, Any]:
    data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(embeddings)]
    return {"object": "list", "model": "e", "data": data, "usage": usage}


def _embeddings(answer: dict[str, Any]) -> list[Any]:
    return [item["embedding"] for item in answer["data"]]


@pytest.mark.parametrize("upstream", [list(VECTORS), PACKED], ids=["floats", "base64"])
def test_a_client_asking_base64_gets_base64_the_sdk_decodes(upstream: list[Any]) -> None:
    # A compatible server that ignores encoding_format answers floats: relayed as they came,
    # a client that asked base64 failed decoding them.
    answer = _answer(upstream)

    assert encoding_problem(answer, {"encoding_format": "base64"}) is None

    assert _embeddings(answer) == PACKED
    parsed = parse_embedding_response(
        CreateEmbeddingResponse.model_construct(**answer), encoding_format=omit
    )
    assert [d.embedding for d in parsed.data] == list(VECTORS)


@pytest.mark.parametrize("asked", ["float", None])
@pytest.mark.parametrize("upstream", [list(VECTORS), PACKED], ids=["floats", "base64"])
def test_a_client_asking_floats_or_nothing_gets_floats(asked: str | None, upstream: Any) -> None:
    answer = _answer(upstream)

    assert encoding_problem(answer, {"encoding_format": asked}) is None

    assert _embeddings(answer) == list(VECTORS)


@pytest.mark.parametrize(
    ("asked", "embedding"),
    [
        ("float", "not base64!"),
        ("float", "AAAA"),  # 3 bytes: no float32 in it
        ("float", ""),
        ("base64", [0.5, "x"]),
        ("base64", [0.5, True]),
        ("base64", [[0.5]]),
        ("base64", [0.5, 10**400]),  # past any float32: array() raised, a 500
        ("float", {"values": [0.5]}),
        ("base64", None),
    ],
)
def test_an_embedding_of_neither_encoding_is_a_problem(asked: str, embedding: Any) -> None:
    assert encoding_problem(_answer([embedding]), {"encoding_format": asked}) is not None


def test_an_upstreams_usage_is_shown_as_it_is_and_billing_reads_the_answer_untouched() -> None:
    reported = _answer(list(VECTORS), {"prompt_tokens": 7, "total_tokens": 7})
    partial = _answer(list(VECTORS), {"prompt_tokens": 7})
    unreported = _answer(list(VECTORS))

    assert shown_usage(reported, 99) is reported
    assert shown_usage(partial, 99)["usage"] == {"prompt_tokens": 7, "total_tokens": 7}
    assert shown_usage(unreported, 99)["usage"] == {"prompt_tokens": 99, "total_tokens": 99}
    assert unreported["usage"] is None and partial["usage"] == {"prompt_tokens": 7}


@pytest.mark.parametrize(
    ("inp", "tokens"),
    [
        ("abcdefgh", 2),
        ("abcdefghi", 3),  # a started token counts
        ("", 1),
        ("é" * 4, 2),  # UTF-8 bytes, as the chat estimate counts
        (["abcd", "abcd"], 2),
        ([1, 2, 3], 3),  # token ids are counted, not estimated
        ([[1, 2, 3], [4, 5]], 5),
    ],
)
def test_the_embeddings_estimate_counts_tokens_given_and_text_at_4_bytes(
    inp: Any, tokens: int
) -> None:
    assert embeddings_estimate({"model": "e", "input": inp}) == tokens
