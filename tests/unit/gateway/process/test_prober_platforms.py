"""The bench prober on ``azure_openai`` and ``gemini`` routes (real fake upstreams): its tiny
request reaches each platform in its own wire with the route's settings and credential, and
a thinking model that spends the one token on thought (no text, ``MAX_TOKENS``) still
proves the route answers; so does an empty answer to the RouteWise prober's latency probe."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from bus import InProcessBus
from gateway.adapters.registry import make_adapters, make_http_client
from gateway.ingress.plan_walk import Targets
from gateway.process.prober import BenchProber
from gateway.process.routewise_prober import RouteWiseProber
from schemas import LatencyProbeDue, ProbeDue, RouteCandidate
from schemas.config import GatewayConfig, credential_id
from tests.fixtures.upstream import Reply

if TYPE_CHECKING:
    from tests.fixtures.upstream import FakeUpstream

KEY = "probe-secret"


def _route(kind: str, up: FakeUpstream) -> dict[str, Any]:
    extra = (
        {"azure": {"deployment": "dep", "api_version": "2025-01-01"}}
        if kind == "azure_openai"
        else {}
    )
    return {
        "kind": kind,
        "base_url": up.base_url,
        "provider_model_id": "pm",
        "api_key": KEY,
        **extra,
    }


async def _probe(kind: str, up: FakeUpstream, *, latency: bool = False) -> bool:
    """Whether the bench prober's probe (``latency``: the RouteWise prober's) passed."""
    config = GatewayConfig.model_validate({"models": [{"id": "m", "route": [_route(kind, up)]}]})
    (endpoint,) = config.models[0].endpoint_ids()
    bus = InProcessBus()
    client = make_http_client()
    try:
        candidate = RouteCandidate(
            endpoint=endpoint,
            kind=kind,
            base_url=up.base_url,
            upstream_model="pm",
            credential_id=credential_id(KEY),
        )
        if latency:
            routewise = RouteWiseProber(bus, make_adapters(client), Targets(config))
            due = LatencyProbeDue(endpoint=endpoint, model="m", candidate=candidate)
            return (await routewise.probe(due)).ok
        prober = BenchProber(bus, make_adapters(client), Targets(config))
        result = await prober.probe(ProbeDue(endpoint=endpoint, model="m", candidate=candidate))
        return result.ok
    finally:
        await client.aclose()
        await bus.aclose()


async def test_probe_of_an_azure_route_uses_its_deployment_version_and_key(
    fake_upstream: FakeUpstream,
) -> None:
    assert await _probe("azure_openai", fake_upstream)

    (rec,) = fake_upstream.requests
    assert rec.path == "/openai/deployments/dep/chat/completions"
    assert (rec.query, rec.headers["api-key"]) == ("api-version=2025-01-01", KEY)
    assert rec.json["max_tokens"] == 1


@pytest.mark.parametrize("parts", [[{"text": "p"}], []], ids=["text", "all-thought"])
async def test_probe_of_a_gemini_route_passes_even_when_the_token_went_to_thought(
    fake_upstream: FakeUpstream, parts: list[dict[str, Any]]
) -> None:
    answer = {
        "candidates": [
            {"content": {"role": "model", "parts": parts}, "finishReason": "MAX_TOKENS"}
        ],
        "usageMetadata": {"promptTokenCount": 1, "thoughtsTokenCount": 1},
    }
    fake_upstream.enqueue(Reply(200, body=answer))

    assert await _probe("gemini", fake_upstream)

    (rec,) = fake_upstream.requests
    assert rec.path == "/v1beta/models/pm:generateContent"
    assert rec.headers["x-goog-api-key"] == KEY
    assert rec.json["generationConfig"] == {"maxOutputTokens": 1}


@pytest.mark.parametrize("latency", [False, True], ids=["bench", "routewise"])
async def test_an_empty_gemini_answer_to_a_probe_proves_the_route_answers(
    fake_upstream: FakeUpstream, latency: bool
) -> None:
    # A plain stop with nothing in it is the model's answer to this request, never the
    # route's failure: the RouteWise prober took it for one (a failed latency sample).
    empty = {"candidates": [{"content": {"role": "model", "parts": []}, "finishReason": "STOP"}]}
    fake_upstream.enqueue(Reply(200, body=empty))

    assert await _probe("gemini", fake_upstream, latency=latency)
    assert len(fake_upstream.requests) == 1
