"""Prompt caching through the gateway to Claude on Bedrock: ``cache_control`` marks become
Converse ``cachePoint`` blocks, and the cache counts Bedrock reports reach the client.

Bedrock caches only up to a ``cachePoint`` (botocore's ``CachePointBlock``), placed right
after the content block, system block or tool it closes; a Messages client (the official
``anthropic`` SDK, marking as Claude Code does) or a chat client (LiteLLM-style marks on
content parts) must have its marks reach Bedrock so, or every turn pays for its whole
prompt. :class:`FakeBedrock` checks each body against botocore's service model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from schemas import Observation, subjects
from tests.e2e.conftest import ONE_BUS, config, model, watch
from tests.e2e.test_prompt_cache_anthropic_sdk import EPHEMERAL, MARKED, SCHEMA
from tests.fixtures.upstream import Reply
from tests.fixtures.upstream_bedrock import BEDROCK_KEY, BEDROCK_REGION, FakeBedrock

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from tests.fixtures.gateway import GatewayFactory

pytestmark = [pytest.mark.e2e, ONE_BUS]

CLAUDE = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
POINT = {"cachePoint": {"type": "default"}}
HOUR_POINT = {"cachePoint": {"type": "default", "ttl": "1h"}}
ANSWER = {
    "output": {"message": {"role": "assistant", "content": [{"text": "Sunny."}]}},
    "stopReason": "end_turn",
    "usage": {
        "inputTokens": 3,
        "outputTokens": 2,
        "totalTokens": 955,
        "cacheReadInputTokens": 900,
        "cacheWriteInputTokens": 50,
    },
    "metrics": {"latencyMs": 10},
}


@pytest.fixture
async def bedrock() -> AsyncIterator[FakeBedrock]:
    up = FakeBedrock("bedrock1")
    await up.start()
    try:
        yield up
    finally:
        await up.close()


def _route(up: FakeBedrock, model_id: str = CLAUDE) -> dict[str, Any]:
    return {
        "kind": "bedrock",
        "base_url": up.base_url,
        "bedrock": {"region": BEDROCK_REGION},
        "provider_model_id": model_id,
        "api_key": BEDROCK_KEY,
    }


async def test_messages_cache_marks_reach_claude_on_bedrock_as_cache_points(
    gateway_factory: GatewayFactory, bedrock: FakeBedrock
) -> None:
    bedrock.enqueue(Reply(body=ANSWER))
    gw = await gateway_factory(config(model("m", _route(bedrock))))

    answer = await gw.anthropic().messages.create(
        model="m", **MARKED, extra_body={"cache_control": EPHEMERAL}
    )

    sent = bedrock.requests[-1].json
    assert sent["system"] == [
        {"text": "You are terse."},
        {"text": "A long, stable preamble."},
        POINT,
    ]
    assert sent["toolConfig"]["tools"] == [
        {"toolSpec": {"name": "get_weather", "inputSchema": {"json": SCHEMA}}},
        POINT,
    ]
    first, assistant, last = sent["messages"]
    assert first["content"] == [{"text": "hi"}, HOUR_POINT]
    assert assistant["content"][0] == {"text": "ok"}
    assert [next(iter(block)) for block in last["content"]] == ["toolResult", "cachePoint"]
    assert len(last["content"]) == 2  # the request's mark: its last block is marked already
    assert answer.usage.cache_read_input_tokens == 900
    assert answer.usage.cache_creation_input_tokens == 50
    assert answer.usage.input_tokens == 3


async def test_chat_cache_marks_reach_claude_on_bedrock_and_no_other_model(
    gateway_factory: GatewayFactory, bedrock: FakeBedrock
) -> None:
    llama = "meta.llama3-70b-instruct-v1:0"
    gw = await gateway_factory(
        config(model("m", _route(bedrock)), model("llama", _route(bedrock, llama)))
    )
    marked = {"type": "text", "text": "A long, stable preamble.", "cache_control": EPHEMERAL}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": [marked]},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]

    for name in ("m", "llama"):
        await gw.openai().chat.completions.create(
            model=name, messages=messages, extra_body={"cache_control": EPHEMERAL}
        )

    claude, other = (r.json for r in bedrock.requests)
    assert claude["system"] == [{"text": "A long, stable preamble."}, POINT]
    assert claude["messages"] == [{"role": "user", "content": [{"text": "hi"}, POINT]}]
    assert "cachePoint" not in bedrock.requests[-1].body.decode()
    assert other["system"] == [{"text": "A long, stable preamble."}]


async def test_claudes_one_hour_cache_writes_on_bedrock_are_billed_at_their_own_price(
    gateway_factory: GatewayFactory, bedrock: FakeBedrock
) -> None:
    # Converse says how many of its cache writes had a 1-hour TTL (cacheDetails): they were
    # billed at the 5-minute write price with the rest.
    usage = {
        "inputTokens": 3,
        "outputTokens": 2,
        "totalTokens": 3905,
        "cacheReadInputTokens": 900,
        "cacheWriteInputTokens": 3000,
        "cacheDetails": [{"ttl": "1h", "inputTokens": 2000}, {"ttl": "5m", "inputTokens": 1000}],
    }
    bedrock.enqueue(Reply(body={**ANSWER, "usage": usage}))
    pricing = {
        "prompt": 2.0,
        "completion": 10.0,
        "input_cache_reads": 0.5,
        "input_cache_writes": 2.5,
        "input_cache_writes_1h": 4.0,
    }
    gw = await gateway_factory(config(model("m", {**_route(bedrock), "pricing": pricing})))

    async with watch(gw, subjects.OBSERVATION_ANY) as seen:
        answer = await gw.anthropic().messages.create(
            model="m", **MARKED, extra_body={"cache_control": EPHEMERAL}
        )
        obs = await seen.next(Observation)

    # 3 fresh, 900 read, 1,000 written for 5 minutes, 2,000 for an hour, 2 out.
    cost = (3 * 2.0 + 900 * 0.5 + 1000 * 2.5 + 2000 * 4.0 + 2 * 10.0) / 1e6
    assert obs.cost_usd == pytest.approx(cost) and not obs.cost_estimated
    assert answer.usage.cache_creation_input_tokens == 3000
    assert answer.usage.cache_creation is not None
    assert answer.usage.cache_creation.ephemeral_1h_input_tokens == 2000
