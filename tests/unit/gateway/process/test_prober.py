"""The bench prober's verdict against a real fake upstream: an answer, a 4xx and a rate limit
prove the route answers (a 429 is back-pressure, not sickness); a 5xx and an exhausted quota
do not."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from bus import InProcessBus
from gateway.adapters.registry import make_adapters, make_http_client
from gateway.ingress.leases import LeaseKeeper
from gateway.ingress.targets import Targets
from gateway.process.prober import BenchProber
from schemas import ProbeDue, RouteCandidate
from schemas.config import GatewayConfig
from tests.fixtures.upstream import Behaviour, Reply

if TYPE_CHECKING:
    from tests.fixtures.upstream import FakeUpstream

QUOTA = {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}
VERDICTS: dict[str, tuple[Behaviour, bool]] = {
    "answer": (Reply(), True),
    "400": (Reply(400), True),
    "429": (Reply(429, headers={"Retry-After": "5"}), True),
    "quota_429": (Reply(429, body=QUOTA), False),
    "500": (Reply(500), False),
}


@pytest.mark.parametrize(("behaviour", "ok"), VERDICTS.values(), ids=VERDICTS.keys())
async def test_bench_probe_verdict(
    fake_upstream: FakeUpstream, behaviour: Behaviour, ok: bool
) -> None:
    bus = InProcessBus()
    client = make_http_client()
    prober = BenchProber(
        bus, make_adapters(client), Targets(GatewayConfig()), LeaseKeeper(bus, 30.0, "prober")
    )
    fake_upstream.enqueue(behaviour)
    candidate = RouteCandidate(
        endpoint="m:a",
        kind="openai_compat",
        base_url=fake_upstream.openai_base_url,
        upstream_model="x",
    )
    try:
        result = await prober.probe(ProbeDue(endpoint="m:a", model="m", candidate=candidate))
    finally:
        await client.aclose()
        await bus.aclose()

    assert result.ok is ok
    assert len(fake_upstream.requests) == 1
