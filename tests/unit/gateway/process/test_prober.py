"""The bench prober's verdict against a real fake upstream: an answer, a 4xx and a rate limit
prove the route answers (a 429 is back-pressure, not sickness); a 5xx and an exhausted quota
do not, nor, for a muted key's probe, the upstream refusing that key."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from bus import InProcessBus
from gateway.adapters.registry import make_adapters, make_http_client
from gateway.ingress.plan_walk import Targets
from gateway.ingress.settling import LeaseKeeper
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


@pytest.mark.parametrize(("status", "key_probe"), [(403, True), (403, False), (402, True)])
async def test_a_muted_keys_probe_fails_when_the_upstream_refuses_the_key(
    fake_upstream: FakeUpstream, status: int, key_probe: bool
) -> None:
    bus = InProcessBus()
    client = make_http_client()
    prober = BenchProber(
        bus, make_adapters(client), Targets(GatewayConfig()), LeaseKeeper(bus, 30.0, "prober")
    )
    fake_upstream.enqueue(Reply(status))
    candidate = RouteCandidate(
        endpoint="m:a",
        kind="openai_compat",
        base_url=fake_upstream.openai_base_url,
        upstream_model="x",
        credential_id="k-first",
    )
    due = ProbeDue(
        endpoint="m:a", model="m", candidate=candidate, credential_id="k-muted" if key_probe else ""
    )
    try:
        result = await prober.probe(due)
    finally:
        await client.aclose()
        await bus.aclose()

    # A route's probe learns the route answers; a key's probe learns the key is still refused.
    assert result.ok is not key_probe
