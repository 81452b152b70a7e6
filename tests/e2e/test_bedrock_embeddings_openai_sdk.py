"""Embeddings on ``bedrock`` routes through the real gateway, with the official openai SDK.

The gateway sends InvokeModel to :class:`FakeBedrock` (which checks each family's body, the
JSON content-type/accept and the SigV4 signature): Amazon Titan Text Embeddings V2 takes one
input per call, Cohere Embed the whole batch. The SDK asks for base64 by default, so the
vectors travel as packed float32 and the SDK decodes them; usage reaches the client and the
attempt's observation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from schemas import Observation, subjects
from tests.e2e.conftest import config, eid, model, watch
from tests.fixtures.upstream_bedrock import BEDROCK_KEY, BEDROCK_REGION, FakeBedrock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.fixtures.gateway import GatewayFactory

pytestmark = pytest.mark.e2e

TITAN, COHERE = "amazon.titan-embed-text-v2:0", "cohere.embed-english-v3"
PER_CALL = 7  # the input tokens the fake reports per InvokeModel call


@pytest.fixture
async def bedrock() -> AsyncIterator[FakeBedrock]:
    up = FakeBedrock("bedrock1", prompt_tokens=PER_CALL)
    await up.start()
    try:
        yield up
    finally:
        await up.close()


def _route(up: FakeBedrock, model_id: str) -> dict[str, object]:
    return {
        "kind": "bedrock",
        "base_url": up.base_url,
        "bedrock": {"region": BEDROCK_REGION},
        "provider_model_id": model_id,
        "api_key": BEDROCK_KEY,
    }


async def test_titan_route_embeds_each_input_with_its_dimensions_and_counts_usage(
    gateway_factory: GatewayFactory, bedrock: FakeBedrock
) -> None:
    gw = await gateway_factory(config(model("titan", _route(bedrock, TITAN))))

    async with watch(gw, subjects.observation(eid("titan", bedrock))) as seen:
        answer = await gw.openai().embeddings.create(
            model="titan", input=["one", "two"], dimensions=256
        )
        observed = await seen.next(Observation)

    assert sorted(r.json["inputText"] for r in bedrock.requests) == ["one", "two"]
    assert all(r.credential == BEDROCK_KEY and r.model == TITAN for r in bedrock.requests)
    assert [(d.index, len(d.embedding)) for d in answer.data] == [(0, 256), (1, 256)]
    assert answer.data[0].embedding != answer.data[1].embedding
    assert answer.usage.prompt_tokens == 2 * PER_CALL
    assert (observed.outcome, observed.prompt_tokens) == ("success", 2 * PER_CALL)


async def test_cohere_route_embeds_the_batch_in_one_call_and_counts_usage(
    gateway_factory: GatewayFactory, bedrock: FakeBedrock
) -> None:
    gw = await gateway_factory(config(model("cohere", _route(bedrock, COHERE))))

    async with watch(gw, subjects.observation(eid("cohere", bedrock))) as seen:
        answer = await gw.openai().embeddings.create(model="cohere", input=["a", "b", "c"])
        observed = await seen.next(Observation)

    (rec,) = bedrock.requests
    assert rec.json == {"texts": ["a", "b", "c"], "input_type": "search_document"}
    assert [(d.index, len(d.embedding)) for d in answer.data] == [(0, 1024), (1, 1024), (2, 1024)]
    assert answer.usage.prompt_tokens == PER_CALL
    assert (observed.outcome, observed.prompt_tokens) == ("success", PER_CALL)
