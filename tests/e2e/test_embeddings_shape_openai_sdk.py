"""An embeddings answer reaches the official ``openai`` SDK in OpenAI's shape whatever an
``openai_compat`` upstream answered: ``usage`` (required: ``prompt_tokens``,
``total_tokens``) when the upstream gave it null or none (some compatible servers do), the
gateway's estimate, the one the request is billed on, where the client got ``usage: null``
and ``answer.usage.prompt_tokens`` raised; each embedding in the ``encoding_format`` asked,
where a server ignoring the field answered floats to a client that asked base64 (or base64
to one that asked floats), which it could not decode. ``dimensions`` and token-array inputs
reach the upstream as sent.
"""

from __future__ import annotations

import array
import base64
from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import ONE_BUS, config, model, route
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream

pytestmark = [pytest.mark.e2e, ONE_BUS]

VECTORS = ([0.5, -0.25], [1.0, 2.0])  # exact in float32
PACKED = [base64.b64encode(array.array("f", v).tobytes()).decode() for v in VECTORS]
_UNSAID = object()


def _answer(embeddings: list[Any], usage: Any = _UNSAID) -> Reply:
    data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(embeddings)]
    body: dict[str, Any] = {"object": "list", "model": "e", "data": data}
    if usage is not _UNSAID:
        body["usage"] = usage
    return Reply(body=body)


@pytest.mark.parametrize("usage", [None, _UNSAID], ids=["null", "missing"])
async def test_an_answer_without_usage_shows_the_estimate_it_is_billed_on(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, usage: Any
) -> None:
    fake_upstream.enqueue(_answer(list(VECTORS), usage), _answer(list(VECTORS), usage))
    client = (await gateway_factory(config(model("m", route(fake_upstream))))).openai()

    tokens = await client.embeddings.create(model="m", input=[[1, 2, 3], [4, 5]])
    text = await client.embeddings.create(model="m", input=["a" * 40, "b" * 10])

    # Token ids are counted; text is estimated at 4 bytes a token, as a chat prompt is.
    assert (tokens.usage.prompt_tokens, tokens.usage.total_tokens) == (5, 5)
    assert (text.usage.prompt_tokens, text.usage.total_tokens) == (13, 13)
    assert fake_upstream.requests[0].json["input"] == [[1, 2, 3], [4, 5]]


@pytest.mark.parametrize("upstream", [list(VECTORS), PACKED], ids=["floats", "base64"])
@pytest.mark.parametrize("asked", ["base64", "float", None], ids=["base64", "float", "default"])
async def test_each_embedding_comes_in_the_encoding_asked(
    gateway_factory: GatewayFactory,
    fake_upstream: FakeUpstream,
    upstream: list[Any],
    asked: str | None,
) -> None:
    fake_upstream.enqueue(_answer(upstream, {"prompt_tokens": 2, "total_tokens": 2}))
    client = (await gateway_factory(config(model("m", route(fake_upstream))))).openai()
    kw: dict[str, Any] = {"encoding_format": asked} if asked else {}

    got = await client.embeddings.create(model="m", input=["a", "b"], dimensions=2, **kw)

    # The SDK itself asks base64 when the caller names no format, and decodes it.
    expected = PACKED if asked == "base64" else list(VECTORS)
    assert [d.embedding for d in got.data] == expected
    sent = fake_upstream.requests[-1].json
    assert (sent["dimensions"], sent["encoding_format"]) == (2, asked or "base64")


async def test_an_embedding_that_is_not_base64_is_a_bad_response_the_next_route_serves(
    gateway_factory: GatewayFactory, fake_upstreams: Any
) -> None:
    broken, good = await fake_upstreams("broken"), await fake_upstreams("good")
    broken.set_default(_answer(["not base64!", "AAAA"]))
    routes = route(broken), route(good, weight=1e-6)  # the broken one drawn first but once in 1e6
    client = (await gateway_factory(config(model("m", *routes)))).openai()

    got = await client.embeddings.create(model="m", input=["a", "b"], encoding_format="float")

    assert [len(d.embedding) for d in got.data] == [8, 8]  # the good fake's
    assert (len(broken.requests), len(good.requests)) == (1, 1)


async def test_a_batch_whose_inputs_each_fit_the_context_window_is_served(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream
) -> None:
    # The window limits each input, not their sum: ten inputs of 20 tokens go to a route of
    # 100 (the request's estimate, 200, paces its token limit; it was refused with a 400).
    fake_upstream.enqueue(_answer([list(VECTORS[0])] * 10))
    cfg = config(model("m", route(fake_upstream, context_window=100)))
    client = (await gateway_factory(cfg)).openai()

    answer = await client.embeddings.create(model="m", input=["x" * 80] * 10)

    assert len(answer.data) == 10 and answer.usage.prompt_tokens == 200
