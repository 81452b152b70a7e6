"""The bench prober on a ``bedrock`` route: its one-token probe is a signed Converse call
the fake Bedrock verifies."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bus import InProcessBus
from gateway.adapters.registry import make_adapters, make_http_client
from gateway.ingress.plan_walk import Targets
from gateway.process.prober import BenchProber
from schemas import ProbeDue, RouteCandidate
from schemas.config import GatewayConfig, credential_id
from tests.fixtures.upstream_bedrock import BEDROCK_KEY, BEDROCK_REGION

if TYPE_CHECKING:
    from tests.fixtures.upstream_bedrock import FakeBedrock

MODEL_ID = "amazon.nova-lite-v1:0"


async def test_a_probe_of_a_bedrock_route_is_a_signed_one_token_converse(
    fake_bedrock: FakeBedrock,
) -> None:
    route = {
        "kind": "bedrock",
        "base_url": fake_bedrock.base_url,
        "bedrock": {"region": BEDROCK_REGION},
        "provider_model_id": MODEL_ID,
        "api_key": BEDROCK_KEY,
    }
    config = GatewayConfig.model_validate({"models": [{"id": "m", "route": [route]}]})
    (endpoint,) = config.models[0].endpoint_ids()
    bus = InProcessBus()
    client = make_http_client()
    prober = BenchProber(bus, make_adapters(client), Targets(config))
    candidate = RouteCandidate(
        endpoint=endpoint,
        kind="bedrock",
        base_url=fake_bedrock.base_url,
        upstream_model=MODEL_ID,
        credential_id=credential_id(BEDROCK_KEY),
    )
    due = ProbeDue(endpoint=endpoint, model="m", candidate=candidate)
    try:
        ok = await prober.probe(due)
    finally:
        await client.aclose()
        await bus.aclose()

    assert ok.ok and ok.credential_id == credential_id(BEDROCK_KEY)
    first = fake_bedrock.requests[0]
    assert (first.credential, first.model) == (BEDROCK_KEY, MODEL_ID)
    assert first.json["inferenceConfig"] == {"maxTokens": 1}
