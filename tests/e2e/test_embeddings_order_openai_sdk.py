"""An embeddings answer reaches the client in input order, one embedding per input, through
the official ``openai`` SDK: an ``openai_compat`` upstream answering its ``data`` out of
order (which the OpenAI API documents it may) has it sorted by ``index``, as LiteLLM does;
before, it was relayed as it came, and a client reading it in order (LangChain, LlamaIndex,
Chroma) silently gave each text another text's vector. One whose ``data`` is not one
embedding per input is the route's bad response: the next route serves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.e2e.conftest import ONE_BUS, config, model, route
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.gateway import GatewayFactory
    from tests.fixtures.upstream import FakeUpstream, UpstreamFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

VECTORS = ([0.5, 0.25], [0.125, 1.0], [0.75, 0.0])
USAGE = {"prompt_tokens": 6, "total_tokens": 6}


def _answer(order: tuple[int, ...]) -> Reply:
    data = [{"object": "embedding", "index": i, "embedding": VECTORS[i]} for i in order]
    return Reply(body={"object": "list", "model": "e", "data": data, "usage": USAGE})


@pytest.mark.parametrize("encoding", ["float", None], ids=["float", "sdk-default"])
async def test_embeddings_answered_out_of_order_reach_the_client_in_input_order(
    gateway_factory: GatewayFactory, fake_upstream: FakeUpstream, encoding: str | None
) -> None:
    fake_upstream.enqueue(_answer((2, 0, 1)))
    client = (await gateway_factory(config(model("m", route(fake_upstream))))).openai()
    kw: dict[str, Any] = {"encoding_format": encoding} if encoding else {}

    got = await client.embeddings.create(model="m", input=["a", "b", "c"], **kw)

    assert [(d.index, d.embedding) for d in got.data] == list(enumerate(VECTORS))
    assert (got.usage.prompt_tokens, got.usage.total_tokens) == (6, 6)


@pytest.mark.parametrize(
    "order", [(0, 1), (0, 1, 2, 2), (0, 1, 1)], ids=["too few", "too many", "index twice"]
)
async def test_embeddings_not_one_per_input_are_a_bad_response_the_next_route_serves(
    gateway_factory: GatewayFactory, fake_upstreams: UpstreamFactory, order: tuple[int, ...]
) -> None:
    broken, good = await fake_upstreams("broken"), await fake_upstreams("good")
    data = [{"object": "embedding", "index": i, "embedding": [0.5, 0.25]} for i in order]
    broken.set_default(Reply(body={"object": "list", "model": "e", "data": data}))
    # The fallback's weight makes the draw pick the broken route first but one in a million.
    routes = route(broken), route(good, weight=1e-6)
    client = (await gateway_factory(config(model("m", *routes)))).openai()

    got = await client.embeddings.create(model="m", input=["a", "b", "c"])

    assert [d.index for d in got.data] == [0, 1, 2]
    assert (len(broken.requests), len(good.requests)) == (1, 1)
